// Probe: which shared-memory layouts and descriptor strides `wgmma` m64n64k16 (bf16 -> f32)
// reads without swizzle, and the accumulator layout, as crates/ssm-cuda/kernels/common.cuh
// (`wg_product`) assumes them. Prints the largest error of each reading against a host product.
// On the GPU machine (nvcc, no Rust):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -o /tmp/wgmma_layouts xtask/probes/wgmma_layouts.cu && /tmp/wgmma_layouts
#include <cstdio>
#include <cstdint>
#include <cmath>
#include <cuda_bf16.h>

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u64 desc(const void* p, u32 lbo, u32 sbo) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    return (u64)((a >> 4) & 0x3fff) | ((u64)((lbo >> 4) & 0x3fff) << 16) | ((u64)((sbo >> 4) & 0x3fff) << 32);
}

#define ACC32(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define DREGS "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"

template <int TA, int TB>
__device__ __forceinline__ void wg_ss(float (&d)[32], u64 da, u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %35, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " DREGS ", %32, %33, p, 1, 1, %36, %34;\n}\n"
                 : ACC32(d) : "l"(da), "l"(db), "n"(TB), "r"(1), "n"(TA));
}
template <int TB>
__device__ __forceinline__ void wg_rs(float (&d)[32], const u32 (&a)[4], u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " DREGS ", {%32,%33,%34,%35}, %36, p, 1, 1, %37;\n}\n"
                 : ACC32(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(1));
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void proxy_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

#define M 64
#define N 64
#define K 32

// mode: 0 A smem K-major + B smem K-major; 1 A smem + B MN-major (trans); 2 A regs + B K-major;
// 3 A regs + B MN-major; 4 A M-major (trans) + B MN-major. lbo/sbo per operand.
__global__ void probe(const __nv_bfloat16* A, const __nv_bfloat16* B, float* D, int mode, u32 albo, u32 asbo,
                      u32 blbo, u32 bsbo) {
    __shared__ __align__(128) __nv_bfloat16 sa[M * K];
    __shared__ __align__(128) __nv_bfloat16 sb[K * N];
    const int tid = threadIdx.x;
    // A K-major core layout: (i, k) at ((i/8)*(K/8) + k/8)*64 + (i%8)*8 + k%8.
    for (int e = tid; e < M * K; e += 128) {
        int i = e / K, k = e % K;
        if (mode == 4) // A M-major: (k, i) at ((k/8)*(M/8) + i/8)*64 + (k%8)*8 + i%8
            sa[((k / 8) * (M / 8) + i / 8) * 64 + (k % 8) * 8 + i % 8] = A[i * K + k];
        else
            sa[((i / 8) * (K / 8) + k / 8) * 64 + (i % 8) * 8 + k % 8] = A[i * K + k];
    }
    for (int e = tid; e < K * N; e += 128) {
        int k = e / N, n = e % N;
        if (mode == 0 || mode == 2) // B K-major: (n, k) at ((n/8)*(K/8) + k/8)*64 + (n%8)*8 + k%8
            sb[((n / 8) * (K / 8) + k / 8) * 64 + (n % 8) * 8 + k % 8] = B[k * N + n];
        else // B MN-major: (k, n) at ((k/8)*(N/8) + n/8)*64 + (k%8)*8 + n%8
            sb[((k / 8) * (N / 8) + n / 8) * 64 + (k % 8) * 8 + n % 8] = B[k * N + n];
    }
    proxy_fence();
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    wg_fence();
    for (int ks = 0; ks < K / 16; ++ks) {
        // K-major operands advance two core matrices along K (2·128 bytes); MN-major B advances
        // two 8-row groups along K: 2 · (N/8) · 128 bytes.
        const __nv_bfloat16* pa = sa + ks * 2 * 64;
        const __nv_bfloat16* pam = sa + ks * 2 * (M / 8) * 64;
        const __nv_bfloat16* pbk = sb + ks * 2 * 64;
        const __nv_bfloat16* pbm = sb + ks * 2 * (N / 8) * 64;
        if (mode == 0) wg_ss<0, 0>(d, desc(pa, albo, asbo), desc(pbk, blbo, bsbo));
        if (mode == 1) wg_ss<0, 1>(d, desc(pa, albo, asbo), desc(pbm, blbo, bsbo));
        if (mode == 4) wg_ss<1, 1>(d, desc(pam, albo, asbo), desc(pbm, blbo, bsbo));
        if (mode == 2 || mode == 3) {
            u32 a[4];
            const int r0 = warp * 16 + g;
            auto pk = [&](int r, int k) {
                __nv_bfloat162 v;
                v.x = A[r * K + k];
                v.y = A[r * K + k + 1];
                return *reinterpret_cast<u32*>(&v);
            };
            a[0] = pk(r0, ks * 16 + 2 * t);
            a[1] = pk(r0 + 8, ks * 16 + 2 * t);
            a[2] = pk(r0, ks * 16 + 2 * t + 8);
            a[3] = pk(r0 + 8, ks * 16 + 2 * t + 8);
            if (mode == 2) wg_rs<0>(d, a, desc(pbk, blbo, bsbo));
            else wg_rs<1>(d, a, desc(pbm, blbo, bsbo));
        }
    }
    wg_commit();
    wg_wait0();
    // Accumulator layout hypothesis: d[4q + e] = (16w + g + 8(e>=2), 8q + 2t + (e&1)).
    for (int q = 0; q < 8; ++q)
        for (int e = 0; e < 4; ++e) {
            int r = warp * 16 + g + 8 * (e >> 1), c = 8 * q + 2 * t + (e & 1);
            D[r * N + c] = d[4 * q + e];
        }
}

int main() {
    __nv_bfloat16 *hA = new __nv_bfloat16[M * K], *hB = new __nv_bfloat16[K * N];
    float *fA = new float[M * K], *fB = new float[K * N], *ref = new float[M * N], *out = new float[M * N];
    u32 s = 12345;
    auto rnd = [&]() { s = s * 1664525u + 1013904223u; return ((s >> 8) & 0xffff) / 65536.f - 0.5f; };
    for (int i = 0; i < M * K; ++i) { hA[i] = __float2bfloat16(rnd()); fA[i] = __bfloat162float(hA[i]); }
    for (int i = 0; i < K * N; ++i) { hB[i] = __float2bfloat16(rnd()); fB[i] = __bfloat162float(hB[i]); }
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            double acc = 0;
            for (int k = 0; k < K; ++k) acc += (double)fA[i * K + k] * fB[k * N + j];
            ref[i * N + j] = (float)acc;
        }
    __nv_bfloat16 *dA, *dB; float* dD;
    cudaMalloc(&dA, M * K * 2); cudaMalloc(&dB, K * N * 2); cudaMalloc(&dD, M * N * 4);
    cudaMemcpy(dA, hA, M * K * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, hB, K * N * 2, cudaMemcpyHostToDevice);
    // K-major operand (K = 32): core matrices along K 128 B apart, 8-row groups (K/8)·128 = 512 B.
    // MN-major B (N = 64): along N 128 B apart, 8-row groups along K (N/8)·128 = 1024 B.
    struct H { int mode; u32 albo, asbo, blbo, bsbo; const char* name; } hs[] = {
        {0, 128, 512, 128, 512, "A smem K-major (LBO=K 128, SBO=M 512), B K-major same"},
        {0, 512, 128, 512, 128, "A,B K-major swapped (LBO=512, SBO=128)"},
        {1, 128, 512, 1024, 128, "B MN-major trans: LBO=K-stride 1024, SBO=N-stride 128"},
        {2, 0, 0, 128, 512, "A regs (mma frag), B K-major"},
        {3, 0, 0, 1024, 128, "A regs, B MN-major LBO=1024 SBO=128"},
        {4, 1024, 128, 1024, 128, "A M-major trans (LBO=K-stride 1024, SBO=M 128), B MN-major"},
        // Last: on an H100 this reading faulted (an illegal address ends the context).
        {1, 128, 512, 128, 1024, "B MN-major trans: LBO=N-stride 128, SBO=K-stride 1024"},
    };
    for (auto& h : hs) {
        cudaMemset(dD, 0, M * N * 4);
        probe<<<1, 128>>>(dA, dB, dD, h.mode, h.albo, h.asbo, h.blbo, h.bsbo);
        cudaError_t e = cudaDeviceSynchronize();
        cudaMemcpy(out, dD, M * N * 4, cudaMemcpyDeviceToHost);
        double err = 0;
        for (int i = 0; i < M * N; ++i) err = fmax(err, fabs(out[i] - ref[i]));
        printf("%-70s err=%s max|d-ref|=%.3g\n", h.name, cudaGetErrorString(e), err);
        if (e != cudaSuccess) return 1;
    }
    return 0;
}
