# The study config as specstudy's own reader sees it (scripts/specstudy/core/studyyaml.py): a duplicate key, a
# non-finite number or a YAML error names the file and the line. config/config.yaml is read here before
# Snakemake's `configfile:` reads it; a --configfile was already read by Snakemake, so its syntax errors
# are Snakemake's (run `specstudy check-config <file>` first), and this re-read catches what it drops silently.
import os
import sys

sys.path.insert(0, os.path.join(workflow.basedir, "scripts"))

from specstudy.core.studyyaml import StudyYamlError as _StudyYamlError, load_study_files as _load_study_files  # noqa: E402

# Snakemake's `configfile:` path is relative to the working directory; when it is absent there, the
# directive itself stops with the full path it checked.
STUDY_CONFIG_FILES = [str(p) for p in workflow.overwrite_configfiles] or [
    p for p in ["config/config.yaml"] if os.path.exists(p)]
try:
    STUDY_CONFIG = _load_study_files(STUDY_CONFIG_FILES, workflow.config_settings.config)
except _StudyYamlError as exc:
    raise WorkflowError(str(exc)) from None

from specstudy.study.snakemake_preflight import check_targets as check_snakemake_targets  # noqa: E402  (end of Snakefile)
