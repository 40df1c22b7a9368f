"""Secrets (API keys, tokens) out of commands, environments, URLs and launch logs."""

from __future__ import annotations

import re

REDACTED = "***REDACTED***"
SECRET_NAME_RE = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|CREDENTIAL|AUTH)", re.I)
SECRET_FLAGS = ("--api-key", "--hf-token", "--token", "--ssl-keyfile-password", "--password")
_TEXT_PATTERNS = [
    # --api-key X / --api-key=X (also --hf-token, --token)
    (re.compile(r"(--(?:api-key|hf-token|token|password)[= ])(\S+)", re.I), r"\1" + REDACTED),
    # NAME=value in env dumps or shell lines for secret-looking names
    (re.compile(r"\b([A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD|API_KEY|APIKEY|ACCESS_KEY)[A-Z0-9_]*)=(\S+)"), r"\1=" + REDACTED),
    # query strings: ?token=..., &api_key=..., access_token, key, sig, signature
    (re.compile(r"([?&](?:token|access_token|api_key|apikey|key|sig|signature|auth)=)[^&\s'\"]+", re.I), r"\1" + REDACTED),
    # user:password@host in URLs
    (re.compile(r"(\w+://[^/\s:@]+:)[^@\s/]+@"), r"\1" + REDACTED + "@"),
    # Authorization headers / bearer tokens
    (re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+", re.I), r"\1" + REDACTED),
    # Python reprs of vLLM's non-default args: 'api_key': ['X'] / 'api_key': 'X'
    (re.compile(r"('(?:api_key|hf_token|token)':\s*)(\[[^\]]*\]|'[^']*'|\"[^\"]*\")", re.I), r"\1'" + REDACTED + "'"),
    # well-known token shapes
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"), REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}\b"), REDACTED),
]


def redact_text(text: str, secrets: list[str] | tuple[str, ...] = ()) -> str:
    """Remove secrets from free text: known secret values first, then secret-looking patterns."""
    if not text:
        return text
    for value in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    for pattern, repl in _TEXT_PATTERNS:
        text = pattern.sub(repl, text)
    return text


def redact_argv(argv: list[str], secrets: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Argument list with the values of secret flags (``--api-key X``, ``--api-key=X``) redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in SECRET_FLAGS:
            if "=" in arg:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg, secrets))
    return out


def redact_env(env: dict[str, str], secrets: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    return {k: (REDACTED if SECRET_NAME_RE.search(k) else redact_text(str(v), secrets)) for k, v in env.items()}


def secret_values(engine_cfg: dict, env: dict[str, str] | None = None) -> list[str]:
    """Values that must never appear in a record: the API key and every secret-named env value."""
    vals = []
    if engine_cfg.get("api_key"):
        vals.append(str(engine_cfg["api_key"]))
    for source in (env or {}, engine_cfg.get("env") or {}):
        vals.extend(str(v) for k, v in source.items() if SECRET_NAME_RE.search(k) and v)
    return vals

