#!/usr/bin/env bash
# Sourced: examples/python/.venv with the exact pins of examples/python/requirements.txt,
# (re)installed when missing or out of date. Sets $venv.
venv=examples/python/.venv
if ! cmp -s examples/python/requirements.txt "$venv/requirements.installed" 2>/dev/null; then
  echo "python-venv: installing examples/python/requirements.txt into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r examples/python/requirements.txt
  cp examples/python/requirements.txt "$venv/requirements.installed"
fi
