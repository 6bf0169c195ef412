#!/usr/bin/env bash
# Jane Austen's six novels for the miniature experiments (hf_posenc_experiments): Debian's r-cran-janeaustenr,
# downloaded with apt-get and unpacked (dpkg-deb -x) under $HF_POSENC_DATA (default ~/.cache/hf-posenc/data),
# so R itself is not installed; hf_posenc_experiments.rdata reads the package's data without R.
# Idempotent: does nothing when the package is already unpacked there (or installed system-wide).
set -euo pipefail
PKG=r-cran-janeaustenr
DATA="${HF_POSENC_DATA:-$HOME/.cache/hf-posenc/data}"
RDB=usr/lib/R/site-library/janeaustenr/data/Rdata.rdb
if [[ -f "$DATA/$PKG/$RDB" || -f "/$RDB" ]]; then
  echo "install_austen: $PKG already present"; exit 0
fi
mkdir -p "$DATA"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
chmod 777 "$tmp"  # apt-get download runs as _apt where it can, which needs to write here
if ! apt-get download "$PKG" >/dev/null 2>&1; then
  echo "install_austen: apt-get download $PKG failed; refreshing the package lists (apt-get update) and retrying" >&2
  apt-get update -qq
  apt-get download "$PKG"
fi
dpkg-deb -x "$PKG"_*.deb "$tmp/unpacked"
rm -rf "$DATA/$PKG"
mv "$tmp/unpacked" "$DATA/$PKG"
echo "install_austen: $PKG unpacked under $DATA/$PKG"
