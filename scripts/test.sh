#!/usr/bin/env bash
# Installs what the tests need (nbmon with its test extra at the versions the
# suite was last run with: constraints/lock.txt; Debian's Chromium for the
# browser tests) and runs the suite: Python, notebooks, browser, JS.
# Arguments go to pytest: `bash scripts/test.sh -m quick` runs the quick tier.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -c constraints/lock.txt -e ".[test]"

if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
  # Playwright's own browser download cannot work offline: use Debian's.
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null
  fi
fi

python3 -m pytest "$@"
