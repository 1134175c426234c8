#!/usr/bin/env bash
# Find Python >= 3.12 and make .venv with the package and its dev tools installed.
# Sourced by the other scripts; safe to run again (reinstalls only when pyproject.toml changes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export LITELLM_LOCAL_MODEL_COST_MAP=True  # litellm must not download its price list
VENV=.venv

works() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }

find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3.13 python3.12 python3; do
        if [[ -n "$candidate" ]] && command -v "$candidate" >/dev/null && works "$candidate"; then
            command -v "$candidate"
            return
        fi
    done
    # pyenv installs that are not the selected version are invisible to the shims.
    for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3; do
        if [[ -x "$candidate" ]] && works "$candidate"; then
            echo "$candidate"
            return
        fi
    done
    if command -v uv >/dev/null; then
        uv python find '>=3.12' 2>/dev/null && return
    fi
    echo "effectful-durable needs Python >= 3.12 and none was found." >&2
    echo "Install one (e.g. 'pyenv install 3.12') or set PYTHON=/path/to/python3.12." >&2
    return 1
}

if ! [[ -x "$VENV/bin/python" ]] || ! works "$VENV/bin/python"; then
    rm -rf "$VENV"
    "$(find_python)" -m venv "$VENV"
fi

stamp="$VENV/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if ! [[ -e "$stamp" ]]; then
    echo "Installing effectful-durable and its dependencies into $VENV ..." >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev,postgres,ui]'
    rm -f "$VENV"/.installed-*
    touch "$stamp"
fi
PYTHON="$PWD/$VENV/bin/python"
export PYTHON
