#!/usr/bin/env bash
# Refuses any edit to SQL a release has shipped: the frozen full scripts and the upgrade
# scripts that lead to a released version (sql/released/SHA256SUMS), and, where git knows
# the release's commit, every upgrade script that commit already had.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
(cd sql/released && sha256sum --check --quiet SHA256SUMS) || {
  echo "check-released: a released script changed (sql/released/SHA256SUMS); write a new upgrade script instead"
  status=1
}
while read -r version commit; do
  [[ -z "$version" || "$version" == \#* ]] && continue
  if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "check-released: commit $commit of $version is not in this clone; checked by SHA256SUMS only"
    continue
  fi
  for script in $(git ls-tree --name-only "$commit" sql/ | grep -E '^sql/idempotency--.+--.+\.sql$' || true); do
    if ! git diff --quiet "$commit" -- "$script"; then
      echo "check-released: $script was released in $version ($commit) and has changed since"
      status=1
    fi
  done
  grep -q "idempotency--$version.sql\$" sql/released/SHA256SUMS ||
    { echo "check-released: sql/released/SHA256SUMS has no frozen script for $version"; status=1; }
done < RELEASES
exit $status
