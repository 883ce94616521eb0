#!/bin/sh
# Fetch jars by Maven coordinates into a folder, each checked against the repository's SHA-1.
#
#   fetch-jars.sh DEST group:artifact:version [group:artifact:version ...]
#
# Writes DEST/<artifact>-<version>.jar (the names LAKEHOUSE_JARS in docker/Dockerfile lists).
# MAVEN_REPOSITORY overrides the repository (default: Maven Central), e.g. for a mirror.
set -eu

repository="${MAVEN_REPOSITORY:-https://repo1.maven.org/maven2}"
dest="$1"
shift
mkdir -p "$dest"
for coordinate in "$@"; do
    group="${coordinate%%:*}"
    rest="${coordinate#*:}"
    artifact="${rest%%:*}"
    version="${rest#*:}"
    if [ -z "$group" ] || [ -z "$artifact" ] || [ -z "$version" ] || [ "$version" = "$rest" ]; then
        echo "fetch-jars: $coordinate is not group:artifact:version" >&2
        exit 2
    fi
    jar="$artifact-$version.jar"
    url="$repository/$(echo "$group" | tr . /)/$artifact/$version/$jar"
    curl --fail --silent --show-error --location --retry 3 -o "$dest/$jar" "$url"
    expected="$(curl --fail --silent --show-error --location --retry 3 "$url.sha1" | cut -c1-40)"
    actual="$(sha1sum "$dest/$jar" | cut -c1-40)"
    if [ "$expected" != "$actual" ]; then
        echo "fetch-jars: $url: SHA-1 $actual, the repository says $expected" >&2
        exit 1
    fi
    echo "fetch-jars: $coordinate -> $dest/$jar"
done
