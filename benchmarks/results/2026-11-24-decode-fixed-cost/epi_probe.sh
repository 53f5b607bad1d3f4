# Build and run the epilogue probe on the device (after the install part). $1 = output dir.
set -eu
OUTD=$1; mkdir -p "$OUTD"
CUT=$(python3 -c "import importlib.util, pathlib; s=importlib.util.find_spec('cutlass_library'); print(pathlib.Path(s.origin).parent / 'source' / 'include')")
for v in 0 1 2 3 4; do
  nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DNDEBUG -O3 \
    -Xcompiler -fPIC -I "$CUT" -I "$CUT/../tools/util/include" -DVARIANT=$v -c diag/epi_probe.cu -o /tmp/epi$v.o &
done
wait
nvcc -shared -gencode=arch=compute_90a,code=sm_90a /tmp/epi{0,1,2,3,4}.o -o /tmp/epi_probe.so
CUDA_VISIBLE_DEVICES=0 python3 diag/epi_probe.py /tmp/epi_probe.so "$OUTD/epi_probe.json"
