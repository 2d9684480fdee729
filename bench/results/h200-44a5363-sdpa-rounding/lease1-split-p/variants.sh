# Sourced on the device after the wheel is installed: switch the installed kernels between P @ V
# with P in two parts or rounded once (split_p's default, per kernel) and RoPE's FP fusion.
SITE=$(python3 -c "import loraplex.kernels, pathlib; print(pathlib.Path(loraplex.kernels.__file__).parent / 'triton')")
variant() { # NAME: old (HEAD) | rot (RoPE unfused) | dec (+ decode split P) | both (+ prefill split P)
  local dec=False pre=False fuse=False
  case $1 in
    old) fuse=True;; rot) ;; dec) dec=True;; both) dec=True pre=True;;
  esac
  sed -i "s/^    split_p: bool = [A-Za-z]*/    split_p: bool = $dec/" $SITE/paged_decode_attention.py
  sed -i "s/^    split_p: bool = [A-Za-z]*/    split_p: bool = $pre/" $SITE/paged_attention.py
  sed -i "s/enable_fp_fusion=[A-Za-z]*/enable_fp_fusion=$fuse/" $SITE/rotary.py
  echo "variant $1: $(grep -h '^    split_p: bool\|enable_fp_fusion=' $SITE/paged_decode_attention.py $SITE/paged_attention.py $SITE/rotary.py | tr -s ' \n' ' ')"
}
