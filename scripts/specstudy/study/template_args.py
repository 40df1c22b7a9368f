"""Per-workload chat-template arguments (the thinking variant, issue #20): declared, checked, sent.

A study config may declare, per workload, keyword arguments for the server's chat template::

    workload_options:
      code_thinking:
        chat_template_kwargs: {enable_thinking: true}

Every chat request of that workload's cells then carries ``"chat_template_kwargs": {...}`` in its
body (:func:`request_extra_body`); vLLM passes them to the template when it renders the prompt.
vLLM silently drops a kwarg the template never reads (``vllm/renderers/hf.py``,
``resolve_chat_template_kwargs``), so a misspelt or unsupported switch would measure the plain
variant under the thinking name. :func:`check_workload_options` therefore refuses every kwarg that
the template the server will use does not read, with the same parse vLLM uses
(``jinja2.meta.find_undeclared_variables``).

Which template the server uses (as vLLM resolves it): ``engine.target.chat_template`` (a file, or a
literal template) if set; else the tokenizer directory's (``engine.target.tokenizer`` or
``engine.target.path``) ``chat_template.jinja``, else the ``chat_template`` of its
``tokenizer_config.json`` (a string, or the ``default`` of a list of named templates).

When the check runs: at every parse of the workflow (``config.check_config``) where the template is
already readable; a target directory that does not exist yet (the fixture models, built by the
workflow) defers it. ``specstudy plan`` (every plan rule runs after the models and corpora) and every
deployment job (``job.spec.deployment_spec``) run it strictly, so no deployment ever starts
with an unchecked switch. The kwargs are part of the cell fingerprint (``job.spec.fingerprint``)
and of the cell summary's ``keys`` (docs/thinking.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specstudy.core.errors import ConfigError

FIELD = "workload_options"
#: Template arguments that vLLM or the request itself sets; a switch must not override them.
RESERVED = frozenset({"messages", "add_generation_prompt", "continue_final_message", "tools", "documents",
                      "chat_template", "tokenize"})


def _options(cfg: dict, workload: str) -> dict:
    return ((cfg.get(FIELD) or {}).get(workload) or {})


def chat_template_kwargs(cfg: dict, workload: str) -> dict:
    """The chat-template kwargs declared for ``workload`` (a copy; ``{}`` when none)."""
    return json.loads(json.dumps(_options(cfg, workload).get("chat_template_kwargs") or {}))


def request_extra_body(cfg: dict, workload: str) -> dict:
    """What every chat request of ``workload`` adds to its body: ``{"chat_template_kwargs": {...}}``,
    or ``{}`` when the workload declares no switch.

    ``cfg``: the study config, or a deployment spec (``job.spec.deployment_spec`` copies the
    config's ``workload_options`` into it)."""
    kwargs = chat_template_kwargs(cfg, workload)
    return {"chat_template_kwargs": kwargs} if kwargs else {}


def workloads_with_options(cfg: dict) -> list[str]:
    """Workloads that declare a chat-template switch (in the config's order)."""
    return [w for w in (cfg.get(FIELD) or {}) if chat_template_kwargs(cfg, w)]


# ------------------------------------------------------------------------------------------ the template
@dataclass(frozen=True)
class Template:
    text: str
    where: str  # the file it came from (or "engine.target.chat_template (inline)")


class TemplateNotReadable(Exception):
    """The target's directory does not exist (yet): the template cannot be read here now."""


def _tokenizer_template(directory: Path) -> Template | None:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():  # transformers prefers it to tokenizer_config.json's (and writes it since 4.5x)
        return Template(jinja.read_text(encoding="utf-8"), str(jinja))
    tc = directory / "tokenizer_config.json"
    if tc.is_file():
        try:
            value = json.loads(tc.read_text(encoding="utf-8")).get("chat_template")
        except ValueError as exc:
            raise ConfigError(f"{tc}: not valid JSON ({exc}); cannot read the target's chat template") from None
        if isinstance(value, list):  # named templates: the default one renders plain chat requests
            value = next((t.get("template") for t in value if isinstance(t, dict) and t.get("name") == "default"), None)
        if isinstance(value, str) and value:
            return Template(value, f"{tc} (field chat_template)")
    return None


def resolve_template(engine: dict) -> Template | None:
    """The chat template the server will render prompts with (see the module doc); ``None`` when the
    target has none. Raises :class:`TemplateNotReadable` when the target directory does not exist."""
    target = engine["target"]
    explicit = target.get("chat_template")
    if explicit:
        p = Path(explicit)
        if p.is_file():
            return Template(p.read_text(encoding="utf-8"), str(p))
        if any(ch in explicit for ch in "{}\n"):  # vLLM takes such a value as the template itself
            return Template(explicit, "engine.target.chat_template (inline)")
        raise ConfigError(f"field 'engine.target.chat_template': {explicit!r} is not a file; "
                          "point it at the template file the server should use")
    directory = Path(target.get("tokenizer") or target["path"])
    if not directory.is_dir():
        raise TemplateNotReadable(str(directory))
    return _tokenizer_template(directory)


def template_variables(text: str) -> set[str]:
    """The variables a chat template reads from its context (what vLLM passes kwargs through for)."""
    import jinja2
    import jinja2.ext
    import jinja2.meta
    import jinja2.nodes
    import jinja2.sandbox

    class _Generation(jinja2.ext.Extension):  # HF's {% generation %} tag (assistant masks), as vLLM parses it
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[_Generation, jinja2.ext.loopcontrols])
    return set(jinja2.meta.find_undeclared_variables(env.parse(text)))


# ------------------------------------------------------------------------------------------ the check
def check_workload_options(cfg: dict, source: str = "<config>", require_template: bool = True) -> str | None:
    """Refuse a workload switch the server would not honour; return the template's file (``None`` when
    nothing was declared, or the check was deferred).

    Always: every workload named is in ``corpora.workloads`` and no kwarg is one the request sets
    itself. Then every kwarg must be a variable the template reads. ``require_template=False`` (the
    workflow's parse) defers that part while the target directory does not exist yet; the plan command
    and the deployment job pass True, where a missing directory is an error."""
    declared = {w: chat_template_kwargs(cfg, w) for w in (cfg.get(FIELD) or {})}
    if not any(declared.values()):
        return None
    workloads = list((cfg.get("corpora") or {}).get("workloads") or [])
    problems = []
    for w, kwargs in declared.items():
        if w not in workloads:
            problems.append(f"field '{FIELD}.{w}': {w!r} is not a workload in corpora.workloads ({', '.join(workloads)}); "
                            "declare the workload there (e.g. the same corpus spec under a name that says thinking) "
                            "or remove this entry")
        for k in sorted(set(kwargs) & RESERVED):
            problems.append(f"field '{FIELD}.{w}.chat_template_kwargs.{k}': set by the request or the server, not a "
                            "template switch; remove it")
    if problems:
        raise ConfigError(f"{source}: invalid study config:\n  - " + "\n  - ".join(problems))
    try:
        template = resolve_template(cfg["engine"])
    except TemplateNotReadable as exc:
        if not require_template:
            return None  # the models are built later; the plan rule and the deployment job check it
        raise ConfigError(f"{source}: field '{FIELD}' declares chat-template kwargs, but the target directory "
                          f"{exc} (engine.target.tokenizer / engine.target.path) does not exist here, so its chat "
                          "template cannot be checked; build or mount the model first, or set "
                          "engine.target.chat_template to the template file the server uses") from None
    if template is None:
        raise ConfigError(f"{source}: field '{FIELD}' declares chat-template kwargs, but the target "
                          f"{cfg['engine']['target'].get('tokenizer') or cfg['engine']['target']['path']} has no chat "
                          "template (no chat_template.jinja, no chat_template in tokenizer_config.json); set "
                          "engine.target.chat_template to a template that reads them")
    variables = template_variables(template.text)
    for w, kwargs in declared.items():
        for k in sorted(set(kwargs) - variables):
            reads = sorted(variables - RESERVED - {"bos_token", "eos_token", "raise_exception", "strftime_now"})
            problems.append(f"field '{FIELD}.{w}.chat_template_kwargs.{k}': the chat template {template.where} never "
                            f"reads {k!r}, so vLLM would drop it silently and measure the plain variant; remove it, or "
                            f"set engine.target.chat_template to a template that reads it (this one reads: "
                            f"{', '.join(reads) or 'no other variables'})")
    if problems:
        raise ConfigError(f"{source}: invalid study config:\n  - " + "\n  - ".join(problems))
    return template.where
