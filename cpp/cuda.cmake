# CUDA part of the build (included from the top-level CMakeLists.txt when nvcc is found):
# distgemm_runtime (CUTLASS SM90 kernels + graph runtime, SHARED: built once, linked by the
# examples and by the Python module) and the example binaries. sm_90a only: wgmma and
# setmaxnreg need the arch-specific target. Kernel instantiations, one translation unit each,
# few to keep the build short (CI compiles this on 2 cores):
#  - GEMM, per dtype (bf16, fp16): output tile 128x256 and 128x128 with a K-contiguous B, and
#    128x256 with an N-contiguous B; bf16 also 128x128 with cluster 1x1, 256x192 with cluster
#    1x2, and 128x256 with the stream-K scheduler;
#  - fp8 GEMM (e4m3 in, bf16 out): 128x192 promoting its accumulator, 128x256 with fast
#    accumulation;
#  - fused GEMM + all-reduce, per dtype: the hand-written decode kernel (every token width in one
#    unit) and CUTLASS's kernel at token tiles 64, 96, 128, 192 and 256.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

set(DISTGEMM_CUDA_FLAGS
  -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DNDEBUG)

add_library(distgemm_runtime SHARED
  cpp/src/runtime/gemm_bf16_n256.cu
  cpp/src/runtime/gemm_bf16_n128.cu
  cpp/src/runtime/gemm_fp16_n256.cu
  cpp/src/runtime/gemm_fp16_n128.cu
  cpp/src/runtime/gemm_bf16_n256_bn.cu
  cpp/src/runtime/gemm_fp16_n256_bn.cu
  cpp/src/runtime/gemm_bf16_n128_c11.cu
  cpp/src/runtime/gemm_bf16_m256_n192.cu
  cpp/src/runtime/gemm_bf16_n256_sk.cu
  cpp/src/runtime/gemm_e4m3_n192.cu
  cpp/src/runtime/gemm_e4m3_n256_fa.cu
  cpp/src/runtime/fused_decode_bf16.cu
  cpp/src/runtime/fused_bf16_t64.cu
  cpp/src/runtime/fused_bf16_t96.cu
  cpp/src/runtime/fused_bf16_t128.cu
  cpp/src/runtime/fused_bf16_t192.cu
  cpp/src/runtime/fused_bf16_t256.cu
  cpp/src/runtime/fused_decode_fp16.cu
  cpp/src/runtime/fused_fp16_t64.cu
  cpp/src/runtime/fused_fp16_t96.cu
  cpp/src/runtime/fused_fp16_t128.cu
  cpp/src/runtime/fused_fp16_t192.cu
  cpp/src/runtime/fused_fp16_t256.cu
  cpp/src/runtime/fused_allreduce.cu
  cpp/src/runtime/kernels.cu
  cpp/src/runtime/graph.cu
  cpp/src/runtime/graph_topology.cpp
  cpp/src/runtime/workspace.cu)
set_target_properties(distgemm_runtime PROPERTIES
  CUDA_ARCHITECTURES OFF CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_compile_options(distgemm_runtime PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${DISTGEMM_CUDA_FLAGS}>)
target_include_directories(distgemm_runtime PRIVATE ${CUTLASS_INCLUDE_DIR})
# The CUDA runtime is linked statically and its symbols stay hidden: a shared libcudart.so.13
# from the toolkit would share its soname with the one torch loads from its own wheel, and the
# first loaded wins for both (a SIGSEGV inside `import torch` when distgemm came first). The
# two static copies (this library and _core) and torch's share the driver's primary context,
# so streams, events and device pointers pass between them as handles.
set_target_properties(distgemm_runtime PROPERTIES CUDA_RUNTIME_LIBRARY Static)
target_link_libraries(distgemm_runtime PUBLIC distgemm_schedule CUDA::cudart_static)
target_link_options(distgemm_runtime PRIVATE "LINKER:--exclude-libs,ALL")
# CUTLASS reaches cuTensorMapEncodeTiled through cudaGetDriverEntryPoint, so libcuda is not
# needed at link time; link it where the toolkit has it (CPU-only CI machines have no driver
# and, in some images, no stub either).
if(TARGET CUDA::cuda_driver)
  target_link_libraries(distgemm_runtime PRIVATE CUDA::cuda_driver)
endif()

# distgemm_bench: one job per file in cpp/examples/bench/ (main.cpp lists them); only
# reference.cu holds kernels.
add_executable(distgemm_bench
  cpp/examples/bench/main.cpp
  cpp/examples/bench/args.cpp
  cpp/examples/bench/reference.cu
  cpp/examples/bench/harness.cpp
  cpp/examples/bench/single_case.cpp
  cpp/examples/bench/faults.cpp
  cpp/examples/bench/graph_json.cpp
  cpp/examples/bench/sweep.cpp)
set_target_properties(distgemm_bench PROPERTIES
  CUDA_ARCHITECTURES OFF CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON CUDA_RUNTIME_LIBRARY Static
  BUILD_RPATH "$<TARGET_FILE_DIR:distgemm_runtime>")
target_compile_options(distgemm_bench PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${DISTGEMM_CUDA_FLAGS}>)
target_link_libraries(distgemm_bench PRIVATE distgemm_runtime)
