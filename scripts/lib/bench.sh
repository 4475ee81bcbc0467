# Shared by the benchmark scripts (sourced): medians of what scripts/lib/adddel-times.sh printed, and the
# ours-against-the-reference table.

# median_us NAME COLUMN <TIMES: the median (µs) of column COLUMN (2 = ADD, 3 = DEL) of NAME's lines.
median_us() {
    awk -v n="$1" -v c="$2" '$1 == n { print $c }' | sort -n | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : 0) }'
}

# µs as "1.23 ms".
ms() { awk -v us="$1" 'BEGIN { printf "%.2f ms", us / 1000 }'; }

# a / b as "2.5x" ("-" when b is 0).
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1fx", a / b; else print "-" }'; }

# adddel_table TIMES OURS_LABEL REF_LABEL [harness]: ADD, DEL and ADD+DEL medians of "ours" and "reference" in
# TIMES and the speed-up; with "harness", also the harness's cost and the speed-up net of it.
adddel_table() {
    local times=$1 ours_label=$2 ref_label=$3 with_harness=${4:-}
    local ours_add ours_del ref_add ref_del harness=0 width=34
    ours_add=$(median_us ours 2 <"$times") ours_del=$(median_us ours 3 <"$times")
    ref_add=$(median_us reference 2 <"$times") ref_del=$(median_us reference 3 <"$times")
    [[ -z $with_harness ]] || harness=$(median_us harness 2 <"$times")
    net() { echo $(( $1 > harness ? $1 - harness : 0 )); }
    printf "%-${width}s %12s %12s %12s\n" "" "ADD" "DEL" "ADD+DEL"
    printf "%-${width}s %12s %12s %12s\n" "$ours_label" "$(ms "$ours_add")" "$(ms "$ours_del")" "$(ms $((ours_add + ours_del)))"
    printf "%-${width}s %12s %12s %12s\n" "$ref_label" "$(ms "$ref_add")" "$(ms "$ref_del")" "$(ms $((ref_add + ref_del)))"
    if [[ -n $with_harness ]]; then
        printf "%-${width}s %12s\n" "harness (exec of /bin/true)" "$(ms "$harness")"
        printf "%-${width}s %12s %12s %12s\n" "speed-up, net of harness" "$(ratio "$(net "$ref_add")" "$(net "$ours_add")")" \
            "$(ratio "$(net "$ref_del")" "$(net "$ours_del")")" \
            "$(ratio "$(net $((ref_add + ref_del)))" "$(net $((ours_add + ours_del)))")"
    else
        printf "%-${width}s %12s %12s %12s\n" "speed-up" "$(ratio "$ref_add" "$ours_add")" "$(ratio "$ref_del" "$ours_del")" \
            "$(ratio $((ref_add + ref_del)) $((ours_add + ours_del)))"
    fi
}
