#!/bin/sh
# Fails unless the shared library $1 exports only stash_* symbols (its undefined imports
# do not count) and does export the C API.
set -eu
lib=$1
defined=$(nm -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }')
bad=$(printf '%s\n' "$defined" | grep -v '^stash_' | grep -v '^$' || true)
if [ -n "$bad" ]; then
  echo "libstash exports symbols outside the stash_ prefix:"
  printf '%s\n' "$bad"
  exit 1
fi
for sym in stash_version stash_status_string stash_last_error stash_pinned_alloc stash_device_alloc \
           stash_plan_make stash_plan_min_feasible stash_profile_validate stash_parse_bytes stash_format_bytes; do
  printf '%s\n' "$defined" | grep -qx "$sym" || { echo "missing export: $sym"; exit 1; }
done
echo "libstash exports $(printf '%s\n' "$defined" | grep -c .) symbols, all stash_*"
