# shellcheck shell=bash
# scripts/lib/bench.sh — helpers the benchmark scripts share (sourced, not run).

# The median of the numbers on stdin, one per line ("nan" when there are none).
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else print v[int((NR + 1) / 2)] }'; }
# A / B to two decimals, "–" when either is missing or B is zero.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0 || a == "nan" || b == "nan") print "–"; else printf "%.2f", a / b }'; }
# ib_send_lat's t_avg (one-way, µs) for SIZE in FILE: its row is
# #bytes #iterations t_min t_max t_typical t_avg ...
ib_lat_avg() { awk -v s="$1" '$1 == s && NF >= 6 { print $6 }' "$2" 2>/dev/null | tail -1; }
