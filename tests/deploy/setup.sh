#!/usr/bin/env bash
# Sets up the tools of the deploy tests under BUILD_DIR/deploy-tools and
# writes BUILD_DIR/deploy-tools/tools.env (shell assignments, empty = not
# available, with a *_WHY saying why):
#   VENV_PYTHON  a venv with kubernetes-validate and yamllint (requirements.txt)
#   KUBECTLS     kubectl binaries with `kubectl kustomize`, space-separated:
#                the one on PATH and Debian's kubernetes-client (1.20, the
#                oldest kustomize the manifests must work with)
#   PROMTOOL     promtool (Debian package prometheus)
# Debian packages already installed are used as they are; otherwise their
# .deb is fetched with `apt-get download` and unpacked here (no root
# needed, nothing installed system-wide). Offline, what cannot be had is
# left empty and the tests that need it skip, saying so.
#
#   tests/deploy/setup.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: setup.sh BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
tools=$build/deploy-tools
mkdir -p "$tools"
exec 9> "$tools/.lock"
flock 9  # ctest -j runs several deploy tests at once

log() { echo "deploy setup: $*" >&2; }

# --- venv with the pinned PyPI packages ---
venv=$tools/venv
stamp=$venv/.requirements
venv_python="" venv_why=""
if [[ -f $stamp ]] && cmp -s "$stamp" "$here/requirements.txt"; then
  venv_python=$venv/bin/python
elif /usr/bin/python3 -m venv --clear "$venv" >/dev/null 2>&1 || {
       venv_why="python3 -m venv failed (Debian package python3-venv missing?)"; false; }; then
  if "$venv/bin/pip" install --quiet --disable-pip-version-check \
       -r "$here/requirements.txt" > "$tools/pip.log" 2>&1; then
    cp "$here/requirements.txt" "$stamp"
    venv_python=$venv/bin/python
  else
    venv_why="pip install -r tests/deploy/requirements.txt failed (offline?), see $tools/pip.log"
  fi
fi
[[ -n $venv_why ]] && log "$venv_why"

# --- Debian packages: installed, else downloaded and unpacked here ---
# deb_tool PACKAGE PATH_IN_PACKAGE: prints the tool's path, or nothing.
deb_tool() {
  local pkg=$1 path=$2 dir=$tools/deb/$1
  if dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" &&
     [[ -x $path ]] && dpkg -S "$path" 2>/dev/null | grep -q "^$pkg:"; then
    echo "$path"; return
  fi
  if [[ ! -x $dir/root$path ]]; then
    # Unpacked beside, then moved in: a test of an earlier setup may be
    # running the old copy.
    rm -rf "$dir.new" && mkdir -p "$dir.new"
    if ! (cd "$dir.new" && apt-get download "$pkg" >/dev/null 2>&1 &&
          dpkg -x ./*.deb root && rm -f ./*.deb); then
      log "cannot install or download Debian package $pkg (offline?)"
      rm -rf "$dir.new"
      return
    fi
    rm -rf "$dir" && mv "$dir.new" "$dir"
  fi
  [[ -x $dir/root$path ]] && echo "$dir/root$path"
}

kubectls=""
if command -v kubectl >/dev/null && kubectl kustomize --help >/dev/null 2>&1; then
  kubectls=$(command -v kubectl)
fi
debian_kubectl=$(deb_tool kubernetes-client /usr/bin/kubectl)
if [[ -n $debian_kubectl && $debian_kubectl != "$kubectls" ]]; then
  kubectls="$kubectls $debian_kubectl"
fi
kubectls=${kubectls# }
kubectl_why=""
[[ -z $kubectls ]] && kubectl_why="no kubectl with kustomize (Debian package kubernetes-client)"

promtool=""
if command -v promtool >/dev/null; then promtool=$(command -v promtool); fi
[[ -z $promtool ]] && promtool=$(deb_tool prometheus /usr/bin/promtool)
promtool_why=""
[[ -z $promtool ]] && promtool_why="no promtool (Debian package prometheus)"

cat > "$tools/tools.env.new" <<ENV
VENV_PYTHON='$venv_python'
VENV_WHY='$venv_why'
KUBECTLS='$kubectls'
KUBECTL_WHY='$kubectl_why'
PROMTOOL='$promtool'
PROMTOOL_WHY='$promtool_why'
ENV
mv "$tools/tools.env.new" "$tools/tools.env"
cat "$tools/tools.env" >&2
