"""The FreeInference Batch client side: the HTTP client, OpenAI batch-file conversion and the
`freeinference-batch` command line. Not part of the Lambda layer."""
