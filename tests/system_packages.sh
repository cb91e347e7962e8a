#!/bin/sh
# Install the Debian packages the tests use, when this machine lets us; otherwise say how.
#   bubblewrap                 the python tool's strongest sandbox level (the tests of that level)
#   chromium, chromium-driver  headless browser tests of `agentrl inspect --html`
#   libjemalloc2               the allocator `agentrl train` runs under where it is installed
# Without them the tests that need them skip, naming this same command.
set -u
missing=""
for p in "$@"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing system packages for the tests:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq $missing >/dev/null && exit 0
  echo "apt-get could not install:$missing" >&2
elif ! command -v dpkg >/dev/null 2>&1; then
  echo "not a Debian system: install the equivalents of:$missing (the tests that need them will skip)" >&2
  exit 0
fi
echo "missing system packages:$missing -- the tests that need them will skip." >&2
echo "to run them too:  sudo apt-get install -y$missing" >&2
exit 0
