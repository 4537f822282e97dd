#!/usr/bin/env bash
# Headless Chromium for tests/observe.rs (the live metrics page rendered as a
# person sees it). Prints the browser's path on stdout. When no Chromium is on
# the PATH it installs Debian's `chromium` package, as root or through
# password-less sudo; anywhere else it fails and says what to install by hand.
# The test calls this once per test binary, so `cargo test --workspace
# --release` needs no set-up of its own.
#
#   tests/support/chromium.sh            # path of a Chromium, installed if missing
set -euo pipefail

say() { echo "chromium.sh: $*" >&2; }

for name in chromium chromium-browser google-chrome; do
    if path=$(command -v "$name"); then
        echo "$path"
        exit 0
    fi
done

if [ "$(id -u)" = 0 ]; then
    as_root=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    say "no Chromium on the PATH and no root to install it: install Debian's 'chromium' package (or any Chromium) by hand"
    exit 1
fi
command -v apt-get >/dev/null || {
    say "no Chromium on the PATH and no apt-get: install a Chromium by hand"
    exit 1
}

# One installer at a time, even if several test binaries ask at once.
lock=/tmp/weir-chromium-install.lock
exec 9>"$lock"
flock 9
if ! command -v chromium >/dev/null; then
    say "installing Debian's chromium (once)"
    "${as_root[@]}" apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq chromium >&2
fi
command -v chromium
