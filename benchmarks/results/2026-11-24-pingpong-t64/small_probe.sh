# Build and run the small-token schedule probe on the device. $1 = output dir. Needs the
# nvidia-cutlass wheel installed (headers) and PYTHONPATH=$PWD.
set -eu
OUTD=$1; mkdir -p "$OUTD"
CUT=$(python3 -c "import importlib.util, pathlib; s=importlib.util.find_spec('cutlass_library'); print(pathlib.Path(s.origin).parent / 'source' / 'include')")
VS=${PROBE_VARIANTS:-0,1,2,3,4}; VS=${VS//,/ }
for v in $VS; do
  nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DNDEBUG -O3 \
    -Xcompiler -fPIC -I "$CUT" -I "$CUT/../tools/util/include" -DVARIANT=$v -c diag/small_probe.cu -o /tmp/sp$v.o > "$OUTD/nvcc$v.log" 2>&1 &
done
wait
nvcc -shared -gencode=arch=compute_90a,code=sm_90a $(for v in $VS; do echo /tmp/sp$v.o; done) -o /tmp/small_probe.so
CUDA_VISIBLE_DEVICES=0 python3 diag/small_probe.py /tmp/small_probe.so "$OUTD/small_probe.json"
