# What the bench scripts share (sourced): the median of numbers given on standard input,
# separated by spaces or newlines; 0 for none.
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {
  if (NR == 0) { print 0; exit }
  if (NR % 2) print v[(NR+1)/2]; else print (v[NR/2] + v[NR/2+1]) / 2 }'; }
