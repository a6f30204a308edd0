"""What goes on the error stream at the end of an exec or attach: a metav1.Status (v4+) or plain text.

Owns the exact shapes kubelet writes, which the Go clients parse (the exit code is read from
details.causes[reason=ExitCode].message). Must not do I/O.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

NON_ZERO_EXIT_CODE_REASON = "NonZeroExitCode"
EXIT_CODE_CAUSE_TYPE = "ExitCode"


@dataclass(frozen=True)
class Status:
    """The fields of metav1.Status that remote command uses."""

    status: str  # "Success" or "Failure"
    message: str = ""
    reason: str = ""
    causes: tuple[tuple[str, str], ...] = ()  # (reason, message)
    code: int = 0

    @property
    def success(self) -> bool:
        return self.status == "Success"

    def to_json(self) -> bytes:
        """Encoded as Go's json.Marshal(metav1.Status) does: omitempty fields left out, an empty
        "metadata" object kept (ListMeta is a struct), keys in struct order, <>& escaped."""
        obj: dict[str, Any] = {"metadata": {}, "status": self.status}
        if self.message:
            obj["message"] = self.message
        if self.reason:
            obj["reason"] = self.reason
        if self.causes:
            causes = []
            for reason, message in self.causes:
                cause = {}
                if reason:
                    cause["reason"] = reason
                if message:
                    cause["message"] = message
                causes.append(cause)
            obj["details"] = {"causes": causes}
        if self.code:
            obj["code"] = self.code
        text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                        ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
            text = text.replace(ch, esc)
        return text.encode("utf-8")

    def to_text(self) -> bytes:
        """The v1-v3 error stream: the message of a failure, nothing on success."""
        return b"" if self.success else self.message.encode("utf-8")


SUCCESS = Status("Success")


def _go_list(cmd: list[str]) -> str:
    # Go's fmt %v of a []string, which kubelet/containerd put in the message.
    return "[" + " ".join(cmd) + "]"


def exit_status(cmd: list[str], exit_code: int) -> Status:
    """The Status for a command that exited with a non-zero code, worded as containerd + kubelet do."""
    inner = f"error executing command {_go_list(cmd)}, exit code {exit_code}"
    return Status("Failure", message=f"command terminated with non-zero exit code: {inner}",
                  reason=NON_ZERO_EXIT_CODE_REASON, causes=((EXIT_CODE_CAUSE_TYPE, str(exit_code)),))


def internal_error(message: str) -> Status:
    """apierrors.NewInternalError: code 500, the error also as the single cause."""
    return Status("Failure", message=f"Internal error occurred: {message}", reason="InternalError",
                  causes=(("", message),), code=500)
