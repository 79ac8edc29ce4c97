#!/usr/bin/env bash
# The Nessie slides' curve (slide 51: expected round trips of a write
# against the load factor; the slide draws it without numbers): one client
# on the simulator inserts distinct keys into an empty table until an
# insert finds no room within the displacement search bound, updating a
# present key after each insert. Per load-factor bucket: mean and p99
# round trips of an insert and of an update, and the displacement paths'
# moves; the load factor reached; a chart. Then the same on a table that
# grows online to eight times its size (--max-capacity): the load factor
# is that of the size new keys go to, and each insert that grew the table
# is reported on its own line.
source "$(dirname "$0")/common.sh"
CAP="${CAPACITY:-65536}"
GROW_CAP="${GROW_CAPACITY:-16384}"
MD="$OUT/nessie_load.md"
"$LB" hash-load --capacity "$CAP" --json > "$OUT/nessie_load.json"
"$LB" hash-load --capacity "$CAP" --plot "$OUT/nessie_load.svg" > "$OUT/nessie_load.txt"
"$LB" hash-load --capacity "$GROW_CAP" --max-capacity $((GROW_CAP * 8)) --json > "$OUT/nessie_load_grow.json"
"$LB" hash-load --capacity "$GROW_CAP" --max-capacity $((GROW_CAP * 8)) --plot "$OUT/nessie_load_grow.svg" > "$OUT/nessie_load_grow.txt"
{
  echo "# Nessie: round trips against the load factor (sim, 1 client, capacity $CAP)"
  echo
  echo '```'
  cat "$OUT/nessie_load.txt"
  echo '```'
  echo
  echo "Chart: nessie_load.svg."
  echo
  echo "## With growth: capacity $GROW_CAP, growing online up to $((GROW_CAP * 8))"
  echo
  echo '```'
  cat "$OUT/nessie_load_grow.txt"
  echo '```'
  echo
  echo "Chart: nessie_load_grow.svg. The inserts that grew the table wait out two"
  echo "phase gaps (R + G + W = 23 ms each, the default time bounds) and drive the"
  echo "split walk, which moves about half the keys one four-CAS move at a time."
  echo
  echo "Reproduce: bench/paper/nessie_load.sh (CAPACITY=N, GROW_CAPACITY=N to resize)."
} > "$MD"
rm "$OUT/nessie_load.txt" "$OUT/nessie_load_grow.txt"
echo "wrote $MD"
