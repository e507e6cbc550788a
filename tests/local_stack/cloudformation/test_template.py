"""freeinference_batch_local/cloudformation/template.py: reading a template as CloudFormation
sees it (short-form tags in their long form) and expanding its local nested applications into
the parent's terms, on small templates and on the repo's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from freeinference_batch_local.cloudformation.template import function_properties, load_template, resources_of_type

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template(REPO / "template.yaml")


@pytest.fixture(scope="module")
def functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {logical_id: function_properties(template, logical_id)
            for logical_id in resources_of_type(template, "AWS::Serverless::Function")}


def test_loader_expands_short_form_tags(tmp_path: Path) -> None:
    # Given a template using every kind of short-form tag the project writes
    path = tmp_path / "t.yaml"
    path.write_text(
        "AWSTemplateFormatVersion: 2010-09-09\n"
        "Conditions:\n"
        "  HasP: !Not [!Equals [!Ref P, '']]\n"
        "  Both: !And [!Condition HasP, !Or [!Condition HasP, !Condition HasP]]\n"
        "Resources:\n"
        "  R:\n"
        "    Properties:\n"
        "      A: !GetAtt Db.Endpoint.Address\n"
        "      B: !GetAtt [Q, Arn]\n"
        "      C: !Sub '${Q}/x'\n"
        "      D: !Sub ['${X}', {X: !Ref Q}]\n"
        "      E: !If [HasP, !Join ['', [a, b]], !Ref AWS::NoValue]\n"
        "      F: !Select [0, !GetAZs '']\n"
    )
    # When it is loaded
    template = load_template(path)
    # Then the tags become CloudFormation's long form and the version stays a string
    assert template["AWSTemplateFormatVersion"] == "2010-09-09"
    assert template["Conditions"]["HasP"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "P"}, ""]}]}
    assert template["Conditions"]["Both"] == {
        "Fn::And": [{"Condition": "HasP"}, {"Fn::Or": [{"Condition": "HasP"}, {"Condition": "HasP"}]}]
    }
    props = template["Resources"]["R"]["Properties"]
    assert props["A"] == {"Fn::GetAtt": ["Db", "Endpoint.Address"]}
    assert props["B"] == {"Fn::GetAtt": ["Q", "Arn"]}
    assert props["C"] == {"Fn::Sub": "${Q}/x"}
    assert props["D"] == {"Fn::Sub": ["${X}", {"X": {"Ref": "Q"}}]}
    assert props["E"] == {"Fn::If": ["HasP", {"Fn::Join": ["", ["a", "b"]]}, {"Ref": "AWS::NoValue"}]}
    assert props["F"] == {"Fn::Select": [0, {"Fn::GetAZs": ""}]}


def test_loader_expands_a_local_nested_application(tmp_path: Path) -> None:
    # Given a parent passing a literal, a Ref and a GetAtt to a child that uses them every way
    (tmp_path / "child").mkdir()
    (tmp_path / "child" / "t.yaml").write_text(
        "Parameters:\n  Name: {Type: String}\n  Arn: {Type: String}\n  Kept: {Type: String, Default: d}\n"
        "  Stack: {Type: String}\n"
        "Resources:\n"
        "  Q:\n    Type: AWS::SQS::Queue\n    Properties:\n"
        "      QueueName: !Sub '${Stack}-${Name}-${Kept}'\n"
        "      Other: !Sub ['${Q.Arn}/${X}', {X: !Ref Arn}]\n"
        "      Policy: !Sub '${Arn}/*'\n"
        "  F:\n    Type: AWS::Serverless::Function\n    DependsOn: Q\n    Properties:\n"
        "      CodeUri: ../code/\n      Queue: !GetAtt Q.Arn\n      Plain: !Sub 'no ${!variables}'\n"
    )
    (tmp_path / "t.yaml").write_text(
        "Resources:\n  B:\n    Type: AWS::S3::Bucket\n"
        "  App:\n    Type: AWS::Serverless::Application\n    Properties:\n      Location: child/t.yaml\n"
        "      Parameters: {Name: n, Arn: !GetAtt B.Arn, Stack: !Ref AWS::StackName}\n"
    )
    # When the parent is loaded
    resources = load_template(tmp_path / "t.yaml")["Resources"]
    # Then the child's resources are the parent's, under App/, in the parent's terms
    assert set(resources) == {"B", "App", "App/Q", "App/F"}
    queue = resources["App/Q"]["Properties"]
    assert queue["QueueName"] == {"Fn::Sub": "${AWS::StackName}-n-d"}
    assert queue["Other"] == {"Fn::Sub": ["${App/Q.Arn}/${X}", {"X": {"Fn::GetAtt": ["B", "Arn"]}}]}
    assert queue["Policy"] == {"Fn::Sub": "${B.Arn}/*"}
    function = resources["App/F"]
    assert function["DependsOn"] == "App/Q"
    assert function["Properties"]["CodeUri"] == "code/"
    assert function["Properties"]["Queue"] == {"Fn::GetAtt": ["App/Q", "Arn"]}
    assert function["Properties"]["Plain"] == {"Fn::Sub": "no ${!variables}"}
    # And without `nested`, the block alone
    assert set(load_template(tmp_path / "t.yaml", nested=False)["Resources"]) == {"B", "App"}


def test_loader_reads_a_nested_applications_outputs_in_the_parents_terms(tmp_path: Path) -> None:
    # Given a child whose outputs name its own resource and a parameter, read by the parent
    (tmp_path / "child.yaml").write_text(
        "Parameters:\n  Topic: {Type: String}\n"
        "Resources:\n  A:\n    Type: AWS::CloudWatch::Alarm\n"
        "Outputs:\n  AArn: {Value: !GetAtt A.Arn}\n  Where: {Value: !Ref Topic}\n")
    (tmp_path / "t.yaml").write_text(
        "Resources:\n  T:\n    Type: AWS::SNS::Topic\n"
        "  App:\n    Type: AWS::Serverless::Application\n    Properties:\n      Location: child.yaml\n"
        "      Parameters: {Topic: !Ref T}\n"
        "  D:\n    Type: AWS::CloudWatch::Dashboard\n    Properties:\n"
        "      Body: !Sub ['${X} ${App.Outputs.Where}', {X: !GetAtt App.Outputs.AArn}]\n"
        "      Named: !GetAtt [App, Outputs.AArn]\n"
        "Outputs:\n  O: {Value: !GetAtt App.Outputs.Where}\n")
    # When the parent is loaded
    template = load_template(tmp_path / "t.yaml")
    # Then each output reads as its value, in the parent's terms
    dashboard = template["Resources"]["D"]["Properties"]
    assert dashboard["Body"] == {"Fn::Sub": ["${X} ${T}", {"X": {"Fn::GetAtt": ["App/A", "Arn"]}}]}
    assert dashboard["Named"] == {"Fn::GetAtt": ["App/A", "Arn"]}
    assert template["Outputs"]["O"]["Value"] == {"Ref": "T"}
    # And an output the child does not have is refused
    (tmp_path / "t.yaml").write_text(
        "Resources:\n  App:\n    Type: AWS::Serverless::Application\n    Properties:\n      Location: child.yaml\n"
        "      Parameters: {Topic: t}\n"
        "  D:\n    Type: AWS::CloudWatch::Dashboard\n    Properties:\n      Body: !GetAtt App.Outputs.Nope\n")
    with pytest.raises(ValueError, match="no output Nope"):
        load_template(tmp_path / "t.yaml")


def test_a_nested_template_may_not_use_its_own_stack_name(tmp_path: Path) -> None:
    # On AWS a nested stack's AWS::StackName is its own (<parent>-<Block>-<random>), not the
    # parent's: queue names built on it would miss the <stack>-model_* pattern.
    (tmp_path / "child.yaml").write_text(
        "Resources:\n  Q:\n    Type: AWS::SQS::Queue\n    Properties:\n"
        "      QueueName: !Sub '${AWS::StackName}-model_x'\n")
    (tmp_path / "t.yaml").write_text(
        "Resources:\n  App:\n    Type: AWS::Serverless::Application\n    Properties:\n"
        "      Location: child.yaml\n")
    with pytest.raises(ValueError, match="AWS::StackName"):
        load_template(tmp_path / "t.yaml")


def test_function_properties_apply_globals_as_sam_does(functions: dict[str, dict[str, Any]]) -> None:
    api = functions["ApiFunction"]
    assert api["Runtime"] == "python3.13"  # from Globals
    assert api["Timeout"] == 29  # the function's own value wins
    variables = api["Environment"]["Variables"]
    assert variables["BATCH_TABLE_NAME"] == {"Ref": "BatchTable"}  # maps merge, keeping the global keys
    # A nested stack's function gets its own template's Globals, never the parent's.
    worker = functions["GlmFlashModel/WorkerFunction"]
    assert worker["Timeout"] == 900 and worker["Runtime"] == "python3.13"  # model/template.yaml's own


def test_nested_applications_expand_into_the_parents_terms(template: dict[str, Any]) -> None:
    # Given the model block glm-5.3-flash, expanded
    worker = template["Resources"]["GlmFlashModel/WorkerFunction"]["Properties"]
    variables = worker["Environment"]["Variables"]
    # Then the child's parameters read as the values the block passes, in the parent's terms...
    assert variables["WORKER_MODEL"] == "glm-5.3-flash"
    assert variables["BATCH_TABLE_NAME"] == {"Ref": "BatchTable"}
    assert worker["Layers"] == [{"Ref": "BatchCoreLayer"}]
    assert worker["ReservedConcurrentExecutions"] == 8
    # ...its own resources are named under the block, and its paths are the parent's
    assert worker["Events"]["Requests"]["Properties"]["Queue"] == {"Fn::GetAtt": ["GlmFlashModel/Queue", "Arn"]}
    assert worker["CodeUri"] == "functions/worker/"
    assert template["Resources"]["GlmFlashModel/WorkerFunctionErrorsAlarm"]["Properties"]["AlarmDescription"] == (
        "The glm-5.3-flash worker failed (README runbook: Function errors).")
    # And the block itself is still there, unexpanded
    assert template["Resources"]["GlmFlashModel"]["Type"] == "AWS::Serverless::Application"
