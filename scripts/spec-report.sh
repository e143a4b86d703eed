# spec-report.sh - sourced by bench-spec.sh and bench-self-spec.sh: the
# figures smol-cli prints on stderr after a plain or a speculative run, and
# llama.cpp's llama-completion, llama-lookup and llama-speculative, read
# from standard input, and the median of a column of numbers.
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
rate_plain() { sed -n 's/.*generation .*(\s*\([0-9.]*\) tokens\/s).*/\1/p'; }
rate_spec() { sed -n 's/.*speculative .*(\([0-9.]*\) tokens\/s).*/\1/p'; }
per_step() { sed -n 's/.*decodes (\([0-9.]*\) tokens each).*/\1/p'; }
kept() { sed -n 's/.*guesses kept (\([0-9.]*\)%).*/\1/p'; }
# llama.cpp: the generation's rate from the context's eval line; lookup's
# and speculative's own summary (each target decode gives one token beyond
# the guesses it kept).
llama_rate_plain() { sed -n '/prompt eval/d; s/.*eval time .*, *\([0-9.]*\) tokens per second.*/\1/p' | tail -n1; }
llama_rate_spec() { sed -n 's/.*decoded .* speed: *\([0-9.]*\) t\/s.*/\1/p'; }
llama_per_step() {
    awk '/n_predict *=/ { p = $NF } /n_accept *=/ { a = $NF } END { if (p > a) printf "%.2f\n", p / (p - a) }'
}
llama_kept() { sed -n 's/.*accept *= *\([0-9.]*\)%.*/\1/p'; }
