"""`freeinference-batch admin preflight`: can this account take the stack, and is it ready?

- Lambda concurrency: the workers reserve concurrency, and Lambda refuses any reservation that
  would leave the account's unreserved pool under 100 (the deploy then fails half-way). The
  check compares the account's quota and unreserved pool with what the template reserves,
  counting what a deployed stack already holds.
- The upstream credential: CloudFormation creates the secret with a random placeholder; a
  secret with only that first version was never given the real credential.
- Slot time (information, never a failure): the most one request may hold a slot of its model,
  every attempt a whole upstream timeout, and how to shorten it.

The AWS clients are passed in, so the checks run against stubs in tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

# Lambda keeps at least this much of an account's concurrency unreserved.
MIN_UNRESERVED = 100
# Service Quotas code of "Concurrent executions" (Lambda), for the increase request.
CONCURRENCY_QUOTA_CODE = "L-B99A9384"


@dataclass(frozen=True)
class Finding:
    ok: bool
    message: str


@dataclass(frozen=True)
class Concurrency:
    account_limit: int
    unreserved_now: int
    template_reserves: int
    stack_reserves_now: int = 0

    @property
    def unreserved_after(self) -> int:
        # What the stack holds now is already out of the pool and comes back on update.
        return self.unreserved_now + self.stack_reserves_now - self.template_reserves

    @property
    def quota_needed(self) -> int:
        """The smallest quota that takes the template: what others reserve, plus ours, plus 100."""
        reserved_by_others = self.account_limit - self.unreserved_now - self.stack_reserves_now
        return reserved_by_others + self.template_reserves + MIN_UNRESERVED

    def finding(self) -> Finding:
        text = (
            f"Lambda concurrency: account quota {self.account_limit}, unreserved now {self.unreserved_now}; "
            f"the template reserves {self.template_reserves}"
            + (f" (the stack holds {self.stack_reserves_now} now)" if self.stack_reserves_now else "")
            + f"; unreserved after deploy {self.unreserved_after} (Lambda requires >= {MIN_UNRESERVED})"
        )
        if self.unreserved_after >= MIN_UNRESERVED:
            return Finding(True, text)
        return Finding(False, text + (
            f". Ask for more: Service Quotas, AWS Lambda, 'Concurrent executions' ({CONCURRENCY_QUOTA_CODE}), "
            f"at least {self.quota_needed}; or lower a model's batch_concurrency in models.json "
            "(its worker reserves twice that: README, 'Sizing a model')"))


def template_reserved_concurrency(template: dict[str, Any]) -> dict[str, int]:
    """Function logical id -> ReservedConcurrentExecutions, for the functions that reserve (a
    reservation given by a parameter, as the API's, counts at the parameter's default)."""
    parameters = template.get("Parameters") or {}
    out = {}
    for logical_id, resource in (template.get("Resources") or {}).items():
        if resource.get("Type") in ("AWS::Serverless::Function", "AWS::Lambda::Function"):
            reserved = (resource.get("Properties") or {}).get("ReservedConcurrentExecutions")
            if isinstance(reserved, dict) and set(reserved) == {"Ref"}:
                reserved = parameters[reserved["Ref"]]["Default"]
            if reserved is not None:
                out[logical_id] = int(reserved)
    return out


def stack_functions(cloudformation: Any, stack_name: str) -> list[str] | None:
    """Physical names of the deployed stack's functions, those of its nested stacks (the models'
    workers) included, or None if there is no such stack."""
    try:
        pages = cloudformation.get_paginator("list_stack_resources").paginate(StackName=stack_name)
        resources = [r for page in pages for r in page["StackResourceSummaries"]]
    except ClientError as error:
        if "does not exist" in str(error):
            return None
        raise
    names = [r["PhysicalResourceId"] for r in resources if r["ResourceType"] == "AWS::Lambda::Function"]
    for nested in (r for r in resources if r["ResourceType"] == "AWS::CloudFormation::Stack"):
        if nested.get("PhysicalResourceId"):  # a nested stack's id is its ARN
            names += stack_functions(cloudformation, nested["PhysicalResourceId"]) or []
    return names


def concurrency(lambda_client: Any, template: dict[str, Any], functions: list[str] | None) -> Concurrency:
    limit = lambda_client.get_account_settings()["AccountLimit"]
    held = 0
    for name in functions or []:
        held += lambda_client.get_function_concurrency(FunctionName=name).get("ReservedConcurrentExecutions") or 0
    return Concurrency(
        account_limit=int(limit["ConcurrentExecutions"]),
        unreserved_now=int(limit["UnreservedConcurrentExecutions"]),
        template_reserves=sum(template_reserved_concurrency(template).values()),
        stack_reserves_now=held,
    )


def upstream_secret(cloudformation: Any, secrets: Any, stack_name: str) -> Finding:
    stack = cloudformation.describe_stacks(StackName=stack_name)["Stacks"][0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs") or []}
    arn = outputs.get("UpstreamApiKeySecretArn")
    if not arn:
        return Finding(False, f"Stack {stack_name} has no output UpstreamApiKeySecretArn: deploy this template")
    versions = secrets.list_secret_version_ids(SecretId=arn)["Versions"]
    if len(versions) <= 1:
        return Finding(False, f"Upstream credential: {arn} still holds CloudFormation's placeholder; put the "
                              "credential (aws secretsmanager put-secret-value, README step 2)")
    return Finding(True, f"Upstream credential: {arn} was set ({len(versions)} versions)")


def slot_time(template: dict[str, Any]) -> Finding:
    """The worst case of one request's slot time at the template's defaults: a request that times
    out every time is retried, as a 429 or a 5xx is, up to `MaxAttempts` (the spec's eight) calls
    of `UpstreamTimeoutSeconds` each, and holds its model's slot (and its account's) through each."""
    parameters = template.get("Parameters") or {}
    attempts = int(parameters["MaxAttempts"]["Default"])
    timeout = float(parameters["UpstreamTimeoutSeconds"]["Default"])
    return Finding(True, (
        f"Slot time: a request whose every call times out holds a slot of its model for {attempts} x "
        f"{timeout:g} s = {attempts * timeout / 60:g} min at worst (MaxAttempts x UpstreamTimeoutSeconds); "
        "a shorter UpstreamTimeoutSeconds (sam deploy --parameter-overrides UpstreamTimeoutSeconds=N) "
        "shortens it, and the longest answer a batch request may have with it (README, 'Sizing a model')"))


def run(template: dict[str, Any], stack_name: str | None, clients: dict[str, Any]) -> list[Finding]:
    """Every check that applies: concurrency always; the secret once the stack exists."""
    functions = stack_functions(clients["cloudformation"], stack_name) if stack_name else None
    findings = [concurrency(clients["lambda"], template, functions).finding(), slot_time(template)]
    if stack_name and functions is None:
        findings.append(Finding(True, f"Stack {stack_name} is not deployed yet: run again after the deploy"))
    elif stack_name:
        findings.append(upstream_secret(clients["cloudformation"], clients["secretsmanager"], stack_name))
    return findings
