#!/usr/bin/env bash
# The lint: ruff over the Python (its rules in pyproject.toml's [tool.ruff]) and ESLint over the front
# end's ES modules (eslint.config.mjs; the tools pinned in package.json and package-lock.json). CI runs it
# from .ci/run before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore ruff==0.17.6
python3 -m ruff check nbmon tests benchmarks

npm ci --no-audit --no-fund --loglevel=error >/dev/null
npm run --silent lint
echo "lint: ruff and eslint clean"
