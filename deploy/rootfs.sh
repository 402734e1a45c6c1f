#!/bin/sh
# The container image's files, from a built waitd: in DIR/root, the binary, the C
# libraries it links (as ldd names them, the loader included), the CA bundle its
# TLS trusts, a user and group for uid 10001 and /tmp; in DIR/home, the empty
# working directory the Dockerfile copies to /var/lib/waitd as that user's (where
# the default SQLite file goes: a copy gives its own owner only to a directory it
# creates). The Dockerfile runs it in the build stage; .ci/image runs it on a
# Debian machine like that stage.
#
#   sh deploy/rootfs.sh BINARY DIR
set -eu
bin=$1
out=$2/root
certs=/etc/ssl/certs/ca-certificates.crt

if ! command -v ldd >/dev/null 2>&1; then
  echo "rootfs: ldd not found (Debian: apt-get install libc-bin)" >&2
  exit 1
fi
if [ ! -f "$certs" ]; then
  echo "rootfs: $certs not found (Debian: apt-get install ca-certificates)" >&2
  exit 1
fi
if ldd "$bin" | grep -q 'not found'; then
  echo "rootfs: $bin links a library this machine does not have:" >&2
  ldd "$bin" >&2
  exit 1
fi

rm -rf "$2"
mkdir -p "$out/usr/local/bin" "$out/etc/ssl/certs" "$out/tmp" "$2/home"
cp "$bin" "$out/usr/local/bin/waitd"
# `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` and the loader's
# `/lib64/ld-linux-x86-64.so.2 (0x…)`, each copied to the path the binary names.
ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' |
  while read -r lib; do
    mkdir -p "$out$(dirname "$lib")"
    cp -L "$lib" "$out$lib"
  done
cp -L "$certs" "$out$certs"
echo 'waitd:x:10001:10001:waitd:/var/lib/waitd:/nonexistent' > "$out/etc/passwd"
echo 'waitd:x:10001:' > "$out/etc/group"
chmod 1777 "$out/tmp"
