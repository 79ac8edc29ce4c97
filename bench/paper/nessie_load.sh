#!/usr/bin/env bash
# The Nessie slides' curve (slide 51: expected round trips of a write
# against the load factor; the slide draws it without numbers): one client
# on the simulator inserts distinct keys into an empty table until an
# insert finds no room within the displacement search bound, updating a
# present key after each insert. Per load-factor bucket: mean and p99
# round trips of an insert and of an update, and the displacement paths'
# moves; the load factor reached; a chart. The table does not grow yet
# (online resize is not built), so there is no curve with growth.
source "$(dirname "$0")/common.sh"
CAP="${CAPACITY:-65536}"
MD="$OUT/nessie_load.md"
"$LB" hash-load --capacity "$CAP" --json > "$OUT/nessie_load.json"
"$LB" hash-load --capacity "$CAP" --plot "$OUT/nessie_load.svg" > "$OUT/nessie_load.txt"
{
  echo "# Nessie: round trips against the load factor (sim, 1 client, capacity $CAP)"
  echo
  echo '```'
  cat "$OUT/nessie_load.txt"
  echo '```'
  echo
  echo "Chart: nessie_load.svg. Reproduce: bench/paper/nessie_load.sh (CAPACITY=N to resize)."
} > "$MD"
rm "$OUT/nessie_load.txt"
echo "wrote $MD"
