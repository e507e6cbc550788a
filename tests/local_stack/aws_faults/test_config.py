"""`LOCAL_AWS_FAULTS` and `LOCAL_AWS_FAULTS_SEED` read and checked; a bad one stops the stack before it starts."""

from __future__ import annotations

import re

import pytest
from freeinference_batch_local.aws_faults.config import FaultConfigError, parse_faults
from freeinference_batch_local.stack import LocalStack


@pytest.mark.parametrize(("text", "seed", "says"), [
    ("dynamodb.throtle=0.1", None, "unknown fault 'dynamodb.throtle'"),
    ("dynamodb.throttle=1.5", None, "from 0 to 1"),
    ("dynamodb.throttle=nan", None, "from 0 to 1"),
    ("dynamodb.error", None, "needs a value"),
    ("dynamodb.stale_ms=0.5", None, "whole milliseconds"),
    ("sqs.duplicate=0.1,,s3.error=0.1", None, "empty entry"),
    ("s3.error=0.1,s3.error=0.2", None, "given twice"),
    ("s3.error=0.1", "soon", "LOCAL_AWS_FAULTS_SEED='soon' is not an integer"),
])
def test_a_bad_configuration_is_refused_naming_what_is_wrong(text, seed, says):
    with pytest.raises(FaultConfigError, match=re.escape(says)):
        parse_faults(text, seed)


def test_a_configuration_reads_back_as_it_was_written():
    config = parse_faults(" dynamodb.throttle=0.25 , dynamodb.stale_ms=1500,sqs.duplicate=1", "-3")
    assert config.values == {"dynamodb.throttle": 0.25, "dynamodb.stale_ms": 1500.0, "sqs.duplicate": 1.0}
    assert config.seed == -3
    assert parse_faults(config.describe(), "-3") == config
    assert not parse_faults("", None).enabled and not parse_faults("s3.error=0", None).enabled


def test_the_local_stack_refuses_to_start_on_a_bad_configuration(tmp_path):
    stack = LocalStack(env={"LOCAL_AWS_FAULTS": "dynamodb.oops=1"}, state_dir=tmp_path, write_state_file=False)
    with pytest.raises(FaultConfigError, match=re.escape("unknown fault 'dynamodb.oops'")):
        stack.start()
    assert stack.moto is None  # refused before anything started
