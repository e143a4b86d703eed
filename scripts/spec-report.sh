# spec-report.sh - sourced by bench-spec.sh and bench-self-spec.sh: the
# figures smol-cli prints on stderr after a plain or a speculative run, read
# from standard input, and the median of a column of numbers.
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
rate_plain() { sed -n 's/.*generation .*(\s*\([0-9.]*\) tokens\/s).*/\1/p'; }
rate_spec() { sed -n 's/.*speculative .*(\([0-9.]*\) tokens\/s).*/\1/p'; }
per_step() { sed -n 's/.*decodes (\([0-9.]*\) tokens each).*/\1/p'; }
kept() { sed -n 's/.*guesses kept (\([0-9.]*\)%).*/\1/p'; }
