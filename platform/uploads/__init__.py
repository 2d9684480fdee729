"""Adapter uploads over HTTP: the streamed multipart body and the archives it may carry."""

from loraplex.platform.uploads.archive import extract_adapter_archive
from loraplex.platform.uploads.guard import UploadGuard
from loraplex.platform.uploads.multipart import (
    FRAMING_BYTES,
    ReceivedUpload,
    UploadLimits,
    receive_upload,
)

__all__ = [
    "FRAMING_BYTES",
    "ReceivedUpload",
    "UploadGuard",
    "UploadLimits",
    "extract_adapter_archive",
    "receive_upload",
]
