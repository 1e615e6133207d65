#!/usr/bin/env bash
# Builds the OCI image localhost/qwen3-vl:<version> (the version of the root Cargo.toml) with
# buildah, from a minimal Debian root filesystem that debootstrap makes (no image registry is
# needed, only a Debian mirror), and checks that the binary runs inside it.
#
# The image holds the CUDA build of qwen3-vl. That binary does not link libcuda: it opens
# libcuda.so.1 at run time, which the NVIDIA container toolkit mounts into the container on a GPU
# host (without it the binary runs on the CPU and says why). Nothing else of CUDA is needed: the
# kernels travel inside the binary as PTX, which the driver compiles.
#
# Usage: tools/build-image.sh [--binary PATH] [--tag NAME:TAG] [--with-ffmpeg]
#                             [--output FILE.tar] [--fresh-rootfs] [--no-check]
#   --binary PATH    the qwen3-vl to put in (default: build it, cargo build --release --features cuda)
#   --tag NAME:TAG   the image name (default: localhost/qwen3-vl:<version>)
#   --with-ffmpeg    add Debian's ffmpeg and its libraries, for videos other than GIF and WebP (+460 MB)
#   --output FILE    also write the image to FILE: an OCI archive (podman load, skopeo), or
#                    Docker's archive when FILE ends in .docker.tar (docker load)
#   --fresh-rootfs   make the root filesystem again instead of reusing target/image/'s
#   --no-check       skip the checks inside the image
#   --work DIR       where the root filesystem and logs go (default: target/image)
#
# Needs root, buildah and debootstrap (Debian: apt-get install -y buildah debootstrap). buildah
# runs with the vfs storage driver and chroot isolation, which work inside a container as well.
set -euo pipefail
cd "$(dirname "$0")/.."

# 1. the options
binary="" tag="" ffmpeg=0 output="" fresh=0 check=1 work=target/image
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary=${2:?--binary needs a path}; shift 2 ;;
        --tag) tag=${2:?--tag needs NAME:TAG}; shift 2 ;;
        --with-ffmpeg) ffmpeg=1; shift ;;
        --output) output=${2:?--output needs a file name}; shift 2 ;;
        --fresh-rootfs) fresh=1; shift ;;
        --no-check) check=0; shift ;;
        --work) work=${2:?--work needs a directory}; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-image.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for tool in buildah debootstrap; do
    command -v "$tool" > /dev/null || { echo "build-image.sh: $tool is missing (Debian: apt-get install -y buildah debootstrap)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "build-image.sh: run as root (debootstrap and buildah's vfs storage need it)" >&2; exit 1; }
version=$(sed -n '/^\[package\]/,/^\[/{s/^version *= *"\(.*\)"/\1/p}' Cargo.toml | head -1)
[ -n "$version" ] || { echo "build-image.sh: no version in Cargo.toml's [package]" >&2; exit 1; }
tag=${tag:-localhost/qwen3-vl:$version}
suite=bookworm mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
bah() { buildah --storage-driver vfs "$@"; }
mkdir -p "$work"

# 2. the binary: given, or the CUDA release build
if [ -z "$binary" ]; then
    echo "== cargo build --release --features cuda"
    # shellcheck disable=SC1091
    [ -f /opt/rust-cuda-env.sh ] && source /opt/rust-cuda-env.sh
    cargo build --release --features cuda
    binary=${CARGO_TARGET_DIR:-target}/release/qwen3-vl
fi
[ -x "$binary" ] || { echo "build-image.sh: $binary is not an executable" >&2; exit 1; }
# the image carries glibc and libgcc only: anything else the binary links would be missing there
needed=$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | tr '\n' ' ')
for lib in $needed; do
    case "$lib" in
        libc.so.6|libm.so.6|libgcc_s.so.1|libpthread.so.0|libdl.so.2|librt.so.1|ld-linux-x86-64.so.2) ;;
        *) echo "build-image.sh: $binary needs $lib, which the image does not carry (only glibc and libgcc)" >&2; exit 1 ;;
    esac
done
echo "== binary $binary ($(du -h "$binary" | cut -f1)), links: $needed"

# 3. the root filesystem: Debian minbase, made once and kept as a tar under $work
variant=minbase
[ $ffmpeg = 1 ] && variant=minbase-ffmpeg
rootfs_tar=$work/rootfs-$suite-$variant.tar
if [ $fresh = 1 ] || [ ! -s "$rootfs_tar" ]; then
    rootfs=$work/rootfs-$variant
    rm -rf "$rootfs"
    include=""
    [ $ffmpeg = 1 ] && include="--include=ffmpeg"
    echo "== debootstrap --variant=minbase $include $suite (log: $work/debootstrap.log)"
    # shellcheck disable=SC2086
    if ! debootstrap --variant=minbase $include "$suite" "$rootfs" "$mirror" > "$work/debootstrap.log" 2>&1; then
        tail -20 "$work/debootstrap.log" >&2
        echo "build-image.sh: debootstrap failed (log: $work/debootstrap.log)" >&2
        exit 1
    fi
    # 3a. slim it as Debian's -slim images are: no documentation, manuals, translations, package
    # lists or downloaded packages, and dpkg told to leave them out of packages added later
    rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
        "$rootfs"/usr/share/locale/* "$rootfs"/usr/share/lintian "$rootfs"/usr/share/linda \
        "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
        "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old "$rootfs"/var/log/* "$rootfs"/tmp/*
    cat > "$rootfs/etc/dpkg/dpkg.cfg.d/slim" << 'EOF'
# the image is slim: packages added later leave these out too
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF
    printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' > "$rootfs/etc/apt/apt.conf.d/99slim"
    # 3b. the user the server runs as (numeric, so Kubernetes' runAsNonRoot can check it), its
    # home (the CUDA driver caches compiled kernels under ~/.nv) and the model's mount point
    echo "qwen:x:10001:10001:qwen3-vl:/home/qwen:/usr/sbin/nologin" >> "$rootfs/etc/passwd"
    echo "qwen:x:10001:" >> "$rootfs/etc/group"
    echo "qwen:*:19000:0:99999:7:::" >> "$rootfs/etc/shadow"
    mkdir -p "$rootfs/home/qwen" "$rootfs/models"
    chown 10001:10001 "$rootfs/home/qwen"
    chmod 1777 "$rootfs/tmp"
    tar --numeric-owner --xattrs -C "$rootfs" -cf "$rootfs_tar.partial" .
    mv "$rootfs_tar.partial" "$rootfs_tar"
    rm -rf "$rootfs"
fi
debian_version=$(tar -xOf "$rootfs_tar" ./etc/debian_version)
echo "== root filesystem $rootfs_tar (Debian $debian_version, $(du -h "$rootfs_tar" | cut -f1))"

# 4. the image: two layers, the root filesystem (an image of its own, kept while the root
# filesystem is the same, so that a new binary ships as a layer of its size alone), then the
# binary and the container's configuration
base=localhost/qwen3-vl-base:$suite-$variant-$(sha256sum "$rootfs_tar" | cut -c1-12)
if [ -z "$(bah images --quiet "$base" 2>/dev/null)" ]; then
    ctr=$(bah from --name "qwen3-vl-base-$$" scratch)
    trap 'bah rm "$ctr" > /dev/null 2>&1 || true' EXIT
    bah add "$ctr" "$rootfs_tar" / > /dev/null
    bah commit --quiet --rm "$ctr" "$base" > /dev/null
    trap - EXIT
fi
ctr=$(bah from --name "qwen3-vl-build-$$" "$base")
trap 'bah rm "$ctr" > /dev/null 2>&1 || true' EXIT
bah copy --chown 0:0 --chmod 0755 "$ctr" "$binary" /usr/local/bin/qwen3-vl > /dev/null
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
description=$(sed -n '/^\[package\]/,/^\[/{s/^description *= *"\(.*\)"/\1/p}' Cargo.toml | head -1)
licenses=$(sed -n '/^\[package\]/,/^\[/{s/^license *= *"\(.*\)"/\1/p}' Cargo.toml | head -1)
bah config \
    --os linux --arch amd64 \
    --entrypoint '["/usr/local/bin/qwen3-vl"]' \
    --cmd '["serve", "--model", "/models/model", "--host", "0.0.0.0", "--port", "8080"]' \
    --port 8080/tcp \
    --user 10001:10001 \
    --workingdir /home/qwen \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env HOME=/home/qwen \
    --env NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    --created-by "tools/build-image.sh" \
    --label "org.opencontainers.image.title=qwen3-vl" \
    --label "org.opencontainers.image.description=$description" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$revision" \
    --label "org.opencontainers.image.licenses=$licenses" \
    --label "org.opencontainers.image.created=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    --label "org.opencontainers.image.base.name=debian:$suite (debootstrap --variant=minbase, $debian_version)" \
    --label "qwen3-vl.ffmpeg=$([ $ffmpeg = 1 ] && echo included || echo absent)" \
    "$ctr"

# 5. the image (an earlier build of the same tag is removed, not left behind untagged)
old=$(bah images --quiet --no-trunc "$tag" 2>/dev/null || true)
bah commit --quiet --rm "$ctr" "$tag" > /dev/null
trap - EXIT
if [ -n "$old" ] && [ "$old" != "$(bah images --quiet --no-trunc "$tag")" ]; then
    bah rmi "$old" > /dev/null 2>&1 || true
fi
echo "== built $tag"

# 6. the checks, in a throwaway container of the image (the image is removed when one fails): the
# binary runs inside as the image's user, and with the repository's tiny model mounted read-only
# it answers what the same binary answers outside
if [ $check = 1 ]; then
    echo "== checks inside the image"
    ctr=$(bah from --name "qwen3-vl-check-$$" "$tag")
    trap 'bah rm "$ctr" > /dev/null 2>&1 || true' EXIT
    fail() { echo "build-image.sh: $*" >&2; bah rm "$ctr" > /dev/null 2>&1; bah rmi "$tag" > /dev/null 2>&1 || true; exit 1; }
    run() { bah run --isolation chroot "$@"; }
    got=$(run "$ctr" -- qwen3-vl --version) || fail "qwen3-vl --version does not run inside the image"
    [ "$got" = "qwen3-vl $version" ] || fail "--version inside says '$got', not 'qwen3-vl $version'"
    user=$(run "$ctr" -- id -u)
    [ "$user" = 10001 ] || fail "the image runs as uid $user, not 10001"
    info=$(run "$ctr" -- qwen3-vl info 2>&1) || fail "qwen3-vl info failed inside the image: $info"
    # no GPU here: the binary must say it looked for the driver library and fell back to the CPU
    grep -q "^backend: CPU" <<< "$info" && grep -q "libcuda.so.1" <<< "$info" || fail "unexpected qwen3-vl info inside the image: $info"
    sed -n '/^backend:/p; /^driver:/p' <<< "$info"
    tiny=tests/fixtures/vision/tiny tok=tests/fixtures/tokenizer/tokenizer.json
    if [ -d "$tiny" ] && [ -f "$tok" ]; then
        args=(generate -q --greedy --device cpu --max-tokens 8 -p "Describe a cat.")
        inside=$(run -v "$PWD/$tiny:/models/model:ro" -v "$PWD/$tok:/models/tokenizer.json:ro" "$ctr" -- \
            qwen3-vl "${args[@]}" -m /models/model --tokenizer /models/tokenizer.json) || fail "generate failed inside the image"
        outside=$("$binary" "${args[@]}" -m "$tiny" --tokenizer "$tok")
        [ "$inside" = "$outside" ] || fail "generate inside the image gave '$inside', outside '$outside'"
        echo "generate on the tiny model (mounted read-only at /models/model): the same reply inside and outside"
    fi
    if [ $ffmpeg = 1 ]; then
        v=$(run "$ctr" -- ffmpeg -hide_banner -version) || fail "ffmpeg does not run inside the image"
        echo "${v%%$'\n'*}"
        video=tests/fixtures/video/ffv1_20x64x64.mkv
        if [ -d "$tiny" ] && [ -f "$tok" ] && [ -f "$video" ]; then
            args=(generate -q --greedy --device cpu --max-tokens 8 -p "What happens here?")
            inside=$(run -v "$PWD/$tiny:/models/model:ro" -v "$PWD/$tok:/models/tokenizer.json:ro" -v "$PWD/$video:/tmp/clip.mkv:ro" "$ctr" -- \
                qwen3-vl "${args[@]}" -m /models/model --tokenizer /models/tokenizer.json --video /tmp/clip.mkv) || fail "generate on an MKV video failed inside the image"
            if command -v ffmpeg > /dev/null; then
                outside=$("$binary" "${args[@]}" -m "$tiny" --tokenizer "$tok" --video "$video")
                [ "$inside" = "$outside" ] || fail "generate on a video inside the image gave '$inside', outside '$outside'"
                echo "generate on an MKV video (through the image's ffmpeg): the same reply inside and outside"
            else
                echo "generate on an MKV video (through the image's ffmpeg) ran; no ffmpeg outside to compare with"
            fi
        fi
    elif [ -d "$tiny" ] && [ -f "$tok" ] && [ -f tests/fixtures/video/ffv1_20x64x64.mkv ]; then
        # without ffmpeg, a video it would decode is refused with an error that says so
        said=$(run -v "$PWD/$tiny:/models/model:ro" -v "$PWD/$tok:/models/tokenizer.json:ro" -v "$PWD/tests/fixtures/video/ffv1_20x64x64.mkv:/tmp/clip.mkv:ro" "$ctr" -- \
            qwen3-vl generate -q --device cpu --max-tokens 4 -m /models/model --tokenizer /models/tokenizer.json --video /tmp/clip.mkv -p hi 2>&1) && fail "an MKV video was accepted by an image without ffmpeg"
        grep -q "no ffmpeg on PATH" <<< "$said" || fail "an MKV video without ffmpeg: unexpected answer '$said'"
        echo "an MKV video is refused without ffmpeg, with a message naming it (--with-ffmpeg adds it)"
    fi
    bah rm "$ctr" > /dev/null
    trap - EXIT
fi

# 7. its size, and an archive of it when asked
bah images --format '{{.Name}}:{{.Tag}} {{.ID}} {{.Size}}' "$tag"
if [ -n "$output" ]; then
    rm -f "$output"
    case "$output" in
        *.docker.tar) format=docker-archive loader="docker load -i" ;;
        *) format=oci-archive loader="podman load -i" ;;
    esac
    bah push --quiet "$tag" "$format:$output:$tag"
    echo "== wrote $output ($format, $(du -h "$output" | cut -f1)); load it with: $loader $output"
fi
