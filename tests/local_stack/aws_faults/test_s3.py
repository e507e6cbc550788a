"""S3's faults: a 500 before the call is applied, an answer lost after it was."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from tests.local_stack.aws_faults.calls import client, counts, new_bucket


def test_s3_errors_refuse_a_share_of_the_calls_with_500_before_applying_them(moto):
    endpoint = moto("s3.error=0.3")
    bucket = new_bucket(endpoint)
    s3 = client("s3", endpoint, attempts=1)
    failed = []
    for n in range(100):
        try:
            s3.put_object(Bucket=bucket, Key=f"o{n}", Body=b"x")
        except ClientError as error:
            assert error.response["Error"]["Code"] == "InternalError"
            assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 500
            failed.append(n)
    assert 15 <= len(failed) <= 45
    names = {o["Key"] for o in client("s3", endpoint, marked=False).list_objects_v2(Bucket=bucket)["Contents"]}
    assert names == {f"o{n}" for n in range(100)} - {f"o{n}" for n in failed}


def test_a_lost_s3_answer_is_applied_then_sent_again(moto):
    endpoint = moto("s3.lost_answer=1")
    bucket = new_bucket(endpoint)
    with pytest.raises(ClientError) as raised:
        client("s3", endpoint, attempts=2).put_object(Bucket=bucket, Key="o", Body=b"written")
    assert raised.value.response["Error"]["Code"] == "InternalError"
    assert counts(endpoint)["s3.lost_answer"] == 2  # both sends applied, both answers lost
    assert client("s3", endpoint, marked=False).get_object(Bucket=bucket, Key="o")["Body"].read() == b"written"
