"""FreeInference Batch: the domain package shared by every Lambda function (deployed as a layer)."""
