"""The Files and Uploads APIs' bodies and answers, in OpenAI's shapes (the `openai` package's
FileObject, Upload and UploadPart)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _json_integer(value: Any) -> Any:
    """A JSON integer (1, or 1.0, which JSON Schema calls an integer too), never true/false or "1"."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be an integer")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_integer)]
JsonStr = Annotated[str, Field(strict=True)]


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["uploaded", "processed", "error"]
    status_details: str | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: JsonInt


class CreateUploadBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    filename: JsonStr = Field(min_length=1, max_length=255)
    purpose: JsonStr
    bytes: JsonInt = Field(ge=1)
    mime_type: JsonStr = Field(min_length=1, max_length=255)
    expires_after: ExpiresAfter | None = None


class CompleteUploadBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    part_ids: list[JsonStr] = Field(min_length=1)
    md5: JsonStr | None = None


class UploadObject(BaseModel):
    id: str
    object: Literal["upload"] = "upload"
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: Literal["pending", "completed", "cancelled", "expired"]
    file: FileObject | None = None


class UploadPartObject(BaseModel):
    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str
