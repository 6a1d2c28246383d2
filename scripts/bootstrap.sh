#!/usr/bin/env bash
# Installs what a fresh machine lacks for airflow-repl: a Java runtime (Spark), PostgreSQL server
# binaries (the sandbox and the tests), a headless browser (chromium: the test that renders
# `airflow-repl report` and the docs' screenshot of it), a C compiler and Python's headers (the Log
# Reader's compiled module, setup.py), a MariaDB server (the sandbox's MariaDB subscriber and its
# tests; never run as a system service), a virtual environment with the package and its test and
# lint dependencies.  Safe to re-run.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

have_pg_server() {
  [ -n "${AIRFLOW_REPL_PG_BINDIR:-}" ] && [ -x "$AIRFLOW_REPL_PG_BINDIR/initdb" ] && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && return 0
  command -v initdb >/dev/null 2>&1
}

missing=()
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
have_pg_server || missing+=(postgresql)
[ -x /usr/sbin/mariadbd ] || [ -n "${AIRFLOW_REPL_MARIADB_BINDIR:-}" ] || command -v mariadbd >/dev/null 2>&1 || missing+=(mariadb-server)
command -v runuser >/dev/null 2>&1 || missing+=(util-linux)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || missing+=(gcc)
"$PYTHON" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || missing+=(python3-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: missing system packages: ${missing[*]}; install them (sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # the packages start a system MariaDB server; airflow-repl starts private ones of its own
  if [[ " ${missing[*]} " == *" mariadb-server "* ]] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now mariadb >/dev/null 2>&1 || true
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
echo "bootstrap: installing airflow-repl and its dependencies into $VENV (first time: a few minutes)"
"$VENV/bin/python" -m pip install -q -e '.[test,lint]'
"$VENV/bin/python" -c 'import airflow_repl.engine.agents._command_lines' 2>/dev/null \
  || echo "bootstrap: warning: the Log Reader's compiled module was not built (no C compiler or Python headers?): the agents run in Python alone" >&2
# The package's bytecode, written once: an editable install leaves it to the first import, which
# cannot write it where PYTHONDONTWRITEBYTECODE is set (containers, CI); every agent process then
# compiles the whole package again as it starts (0.13 s more per process here).
"$VENV/bin/python" -m compileall -q airflow_repl > /dev/null
