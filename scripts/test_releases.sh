#!/usr/bin/env bash
# The suite in a fresh virtual environment against other releases than the
# lock's, so that drift shows up as a failing CI line, not a user's report:
#   newest  whatever pip brings today
#   oldest  the lower bounds pyproject.toml declares (constraints/oldest.txt)
# Runs every tier whose outcome depends on those releases (not the soaks nor
# the second-user tests); more arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:?newest or oldest}; shift
case $which in
  newest) pins=() ;;
  oldest) pins=(-c constraints/oldest.txt) ;;
  *) echo "test_releases.sh: newest or oldest, not $which" >&2; exit 2 ;;
esac
venv="${TMPDIR:-/tmp}/nbmon-$which"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" -e ".[test]"
"$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null \
  | grep -iE '^(ipython|ipykernel|ipywidgets|anywidget|plotly|pandas|numpy|psutil|traitlets|jupyterlab|notebook|distributed) ' \
  | tr -s ' ' | paste -sd ',' | sed "s/^/releases ($which): /"
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -p no:cacheprovider -m "not slow and not multiuser" "$@"
