#!/usr/bin/env bash
# The main job: the offline multi-agent workflow, no API key needed.
# Ctrl-C it and run it again: it resumes. Run it after it finished: it replays.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$PYTHON" examples/multi_agent/workflow.py "$@"
