// wide_kernels.cpp: the C API of include/wide_kernels.h over the ahead-of-time compiled Triton kernels.
//
// The cubins (one per kernel specialization and architecture) are embedded from wide_aot.bin with
// .incbin; wide_aot_table.inc lists them (see wide_export/kernels/aot.py). This file only validates
// arguments, picks the algorithm and tile exactly as wide_export/kernels/{launch,configs,policy}.py
// do, picks each kernel's variant from the call's alignment (pickCubin), and launches through the
// CUDA driver API. Modules are loaded once per CUDA context. The driver
// API is taken from libcuda.so.1 at run time (dlopen), as TensorRT does: the library links no libcuda,
// so it builds where only the toolkit is installed (CI) and loads wherever a driver is.
//
// The dense algorithm (WIDE_ALGO_DENSE, AUTO's fallback where policy.json says "dense") is cuBLASLt
// (cublasLtMatmul, the bias fused as its epilogue) followed by the mask pass (wide_apply_mask_kernel),
// compiled in when CMake finds cublasLt.h (WIDE_HAVE_CUBLASLT) and taken from libcublasLt at run time
// (dlopen, as libcuda); without it the dense fallback runs the tile kernels.
#include "wide_kernels.h"

#include <cuda.h>
#include <dlfcn.h>
#ifdef WIDE_HAVE_CUBLASLT
#include <cublasLt.h>
#include <cstdlib>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

// ---------------------------------------------------------------------------------------------
// Embedded cubins
#define WIDE_STR2(x) #x
#define WIDE_STR(x) WIDE_STR2(x)
__asm__(".section .rodata\n"
        ".balign 16\n"
        "wide_aot_blob:\n"
        ".incbin \"" WIDE_STR(WIDE_AOT_BLOB) "\"\n"
        ".previous\n");
extern "C" const unsigned char wide_aot_blob[];

namespace
{

struct Cubin
{
    char const* key;
    int arch;
    size_t offset;
    size_t size;
    char const* name;
    unsigned shared;
    unsigned warps;
    int nparams; // the kernel's runtime parameters (constexprs excluded): launch() checks the call against it
    unsigned align; // 16: the "a16" variant, compiled assuming the parameters of hintMask are multiples of 16;
                    // 1: the "any" variant, compiled assuming nothing (correct for every call)
    uint32_t hintMask; // bit i: runtime parameter i (pointer address or integer) is hinted divisible by align
};

Cubin const kCubins[] = {
#include "wide_aot_table.inc"
};
int const kNumCubins = static_cast<int>(sizeof(kCubins) / sizeof(kCubins[0]));

//! A per-shape override of gemv_max_m (policy.json "gemv_max_m_shapes"): kind 'n', 'g' (gated) or 'k'; 0 = unused.
struct ShapeRule
{
    char kind;
    int64_t N, K, gemvMaxM;
};
//! One GEMM family's prefill_tiles buckets (policy.json): from minM[i] rows, size class cls[i] (configs.SIZES).
constexpr int kMaxTileBuckets = 4; // policy.MAX_TILE_BUCKETS
struct TileBuckets
{
    int n;
    int64_t minM[kMaxTileBuckets];
    int cls[kMaxTileBuckets];
};
//! The families of prefill_tiles, in configs.TILE_FAMILIES' order.
enum Family
{
    kFamTileN = 0,
    kFamTileGated = 1,
    kFamTileK = 2,
    kFamGroupedN = 3,
    kFamGroupedGated = 4,
};
struct Policy
{
    int arch; // 0 = default
    char const* device; // "": the architecture's entry; else the entry of devices of this name ("sm_90@NVIDIA H200")
    int64_t gemvMaxMN, gemvMaxMGated, gemvMaxMK; // gemv_max_m per kernel kind
    int64_t groupedNMinM, groupedNMinGs, groupedKMinM, groupedKMinGs;
    int fallbackDense; // 1: "fallback": "dense" (cuBLASLt when this build has it, else tile); 0: "tile"
    TileBuckets tiles[5]; // per Family: which size class a prefill of M rows takes, where the arch has it
    ShapeRule shapes[8];
};
Policy const kPolicies[] = {
#include "wide_aot_policy.inc"
};

// Tiles: keep in step with wide_export/kernels/configs.py (tests/kernels/test_build.py checks them).
constexpr int kGemvBlockN = 8;
constexpr int kGemvBlockK = 256;
// Decode split-K GEMV (gemv_k) and its plan: keep in step with configs.py and launch.gemv_k_plan.
constexpr int kGemvKBlockN = 32;
constexpr int kGemvKBlockK = 128;
constexpr int kDecodeSms = 132;
constexpr int kDecodeTargetWaves = 4;
constexpr int kSplitkReduceBlock = 1024;
// Split router (decode): keep in step with configs.py and launch.router_plan.
constexpr int kRouterSplitMaxM = 64;
constexpr int kRouterSplitBlockM = 8;
constexpr int kRouterSplitBlockR = 8;
constexpr int kRouterSplitBlockH = 16;
constexpr int kRouterBlockM = 16;
constexpr int kAttnBlockM = 64;    // WideMaskedAttention: queries per program (configs.ATTENTION_BLOCK_M)
constexpr int kAttnBlockDs[] = {64, 128}; // head sizes of its cubins (configs.ATTENTION_BLOCK_DS)
constexpr int kAttnDecodeBlockH = 16;   // one query: query heads of a KV head in one tile (configs.ATTENTION_DECODE_BLOCK_H)
constexpr int kAttnDecodeBlockL = 64;   // keys per decode step (configs.ATTENTION_DECODE_BLOCK_L)
constexpr int kAttnMaxSplits = 64;      // decode splits over the keys at most (configs.ATTENTION_MAX_SPLITS)
constexpr int kAttnTargetPrograms = 264; // decode programs a call aims at (configs.ATTENTION_TARGET_PROGRAMS)
constexpr int kRouterBlockRs[] = {16, 32, 64, 128, 256};
constexpr int kCastBlock = 1024;
constexpr int kTileBlockM = 64;
constexpr int kTileBlockN = 64;
constexpr int kLargeBlockM = 128;     // the "/large" cubins (configs.LARGE_*): tile_n / tile_k 128 x 128,
constexpr int kLargeTileBlockN = 128; // grouped_n 128 x its group's BLOCK_N;
constexpr int kLargeGatedBlockN = 64; // gated: at most 64 wide (two accumulators)
constexpr int kWideBlockM = 128;      // the "/wide" cubins (configs.WIDE_*): tile_n (plain, bias) / tile_k,
constexpr int kWideBlockN = 256;      // a16 only (sized() steps an unaligned call down to "/large")
char const* const kSizeSuffix[] = {"", "/large", "/wide"}; // configs.SIZES: small, large, wide
int const kTileSizeBlockM[] = {kTileBlockM, kLargeBlockM, kWideBlockM}; // tile_n / tile_k per size class

//! BLOCK_N of the tile kernels (tile_n, tile_k) in size class `size` (gated: the large tile is 64 wide, no wide).
int tileBlockN(int size, bool gated)
{
    int const blockN[] = {kTileBlockN, gated ? kLargeGatedBlockN : kLargeTileBlockN, kWideBlockN};
    return blockN[size];
}
constexpr int kGroupedBlockM = 64;
constexpr int kGroupedBlockNs[] = {128, 64, 32, 16};
constexpr int kGroupedKBlockN = 128;
constexpr int kApplyMaskBlockM = 8;
constexpr int kApplyMaskBlockN = 256;
#ifdef WIDE_HAVE_CUBLASLT
constexpr size_t kLtWorkspace = size_t{32} << 20; // cuBLASLt's scratch (NVIDIA suggests 32 MiB on Hopper)
#else
constexpr size_t kLtWorkspace = 0;
#endif

thread_local std::string tLastCudaError;

//! The driver API entry points this file uses, resolved from libcuda.so.1 once.
struct Driver
{
    bool ok = false;
    decltype(&::cuGetErrorString) getErrorString = nullptr;
    decltype(&::cuCtxGetDevice) ctxGetDevice = nullptr;
    decltype(&::cuCtxGetCurrent) ctxGetCurrent = nullptr;
    decltype(&::cuDeviceGetAttribute) deviceGetAttribute = nullptr;
    decltype(&::cuDeviceGetName) deviceGetName = nullptr;
    decltype(&::cuModuleLoadData) moduleLoadData = nullptr;
    decltype(&::cuModuleGetFunction) moduleGetFunction = nullptr;
    decltype(&::cuFuncSetAttribute) funcSetAttribute = nullptr;
    decltype(&::cuLaunchKernel) launchKernel = nullptr;
    decltype(&::cuMemsetD8Async) memsetD8Async = nullptr;
};

template <typename F>
bool resolveSym(void* lib, F& fn, char const* name)
{
    fn = reinterpret_cast<F>(dlsym(lib, name));
    return fn != nullptr;
}

Driver const& driver()
{
    static Driver const d = [] {
        Driver r;
        void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib)
            return r;
        // WIDE_STR expands cuda.h's versioning macros (e.g. cuCtxGetDevice -> its current ABI name).
        r.ok = resolveSym(lib, r.getErrorString, WIDE_STR(cuGetErrorString))
            && resolveSym(lib, r.ctxGetDevice, WIDE_STR(cuCtxGetDevice))
            && resolveSym(lib, r.ctxGetCurrent, WIDE_STR(cuCtxGetCurrent))
            && resolveSym(lib, r.deviceGetAttribute, WIDE_STR(cuDeviceGetAttribute))
            && resolveSym(lib, r.deviceGetName, WIDE_STR(cuDeviceGetName))
            && resolveSym(lib, r.moduleLoadData, WIDE_STR(cuModuleLoadData))
            && resolveSym(lib, r.moduleGetFunction, WIDE_STR(cuModuleGetFunction))
            && resolveSym(lib, r.funcSetAttribute, WIDE_STR(cuFuncSetAttribute))
            && resolveSym(lib, r.launchKernel, WIDE_STR(cuLaunchKernel))
            && resolveSym(lib, r.memsetD8Async, WIDE_STR(cuMemsetD8Async));
        return r;
    }();
    return d;
}

#ifdef WIDE_HAVE_CUBLASLT
//! The cuBLASLt entry points, resolved once from $WIDE_CUBLASLT_LIBRARY, libcublasLt.so.<major> on the
//! loader's path, or the folder CMake found the library in.
struct Lt
{
    bool ok = false;
    decltype(&::cublasLtCreate) create = nullptr;
    decltype(&::cublasLtMatmulDescCreate) descCreate = nullptr;
    decltype(&::cublasLtMatmulDescDestroy) descDestroy = nullptr;
    decltype(&::cublasLtMatmulDescSetAttribute) descSet = nullptr;
    decltype(&::cublasLtMatrixLayoutCreate) layoutCreate = nullptr;
    decltype(&::cublasLtMatrixLayoutDestroy) layoutDestroy = nullptr;
    decltype(&::cublasLtMatmulPreferenceCreate) prefCreate = nullptr;
    decltype(&::cublasLtMatmulPreferenceDestroy) prefDestroy = nullptr;
    decltype(&::cublasLtMatmulPreferenceSetAttribute) prefSet = nullptr;
    decltype(&::cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
    decltype(&::cublasLtMatmul) matmul = nullptr;
    decltype(&::cublasLtGetStatusString) statusString = nullptr;
};

Lt const& lt()
{
    static Lt const l = [] {
        Lt r;
        std::string const soname = "libcublasLt.so." WIDE_STR(CUBLAS_VER_MAJOR);
        std::vector<std::string> candidates;
        if (char const* env = std::getenv("WIDE_CUBLASLT_LIBRARY"))
            candidates.emplace_back(env);
        candidates.push_back(soname);
#ifdef WIDE_CUBLASLT_LIB_DIR
        candidates.push_back(std::string(WIDE_STR(WIDE_CUBLASLT_LIB_DIR)) + "/" + soname);
#endif
        void* lib = nullptr;
        for (std::string const& c : candidates)
        {
            if ((lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr)
                break;
        }
        if (!lib)
            return r;
        r.ok = resolveSym(lib, r.create, "cublasLtCreate") && resolveSym(lib, r.descCreate, "cublasLtMatmulDescCreate")
            && resolveSym(lib, r.descDestroy, "cublasLtMatmulDescDestroy")
            && resolveSym(lib, r.descSet, "cublasLtMatmulDescSetAttribute")
            && resolveSym(lib, r.layoutCreate, "cublasLtMatrixLayoutCreate")
            && resolveSym(lib, r.layoutDestroy, "cublasLtMatrixLayoutDestroy")
            && resolveSym(lib, r.prefCreate, "cublasLtMatmulPreferenceCreate")
            && resolveSym(lib, r.prefDestroy, "cublasLtMatmulPreferenceDestroy")
            && resolveSym(lib, r.prefSet, "cublasLtMatmulPreferenceSetAttribute")
            && resolveSym(lib, r.heuristic, "cublasLtMatmulAlgoGetHeuristic")
            && resolveSym(lib, r.matmul, "cublasLtMatmul") && resolveSym(lib, r.statusString, "cublasLtGetStatusString");
        return r;
    }();
    return l;
}
#endif

//! Whether the dense algorithm can run: cuBLASLt compiled in and its library loadable.
bool haveLt()
{
#ifdef WIDE_HAVE_CUBLASLT
    return lt().ok;
#else
    return false;
#endif
}

int cudaFail(CUresult r, char const* what)
{
    char const* s = nullptr;
    driver().getErrorString(r, &s);
    tLastCudaError = std::string(what) + ": " + (s ? s : "unknown CUDA error");
    return WIDE_ERR_CUDA;
}

char const* dtypeName(wide_dtype_t d)
{
    switch (d)
    {
    case WIDE_FLOAT32: return "float32";
    case WIDE_FLOAT16: return "float16";
    case WIDE_BFLOAT16: return "bfloat16";
    }
    return nullptr;
}

//! The current device's compute capability (major * 10 + minor) and, when `name` is given, its name
//! (cuDeviceGetName, e.g. "NVIDIA H200"; kept per thread for the device it last named: no lock per launch).
int deviceArch(int& arch, std::string* name = nullptr)
{
    if (!driver().ok)
    {
        tLastCudaError = "libcuda.so.1 (the NVIDIA driver) could not be loaded";
        return WIDE_ERR_CUDA;
    }
    CUdevice dev;
    CUresult r = driver().ctxGetDevice(&dev);
    if (r != CUDA_SUCCESS)
    {
        cudaFree(nullptr); // make the runtime create and bind its primary context
        r = driver().ctxGetDevice(&dev);
    }
    if (r != CUDA_SUCCESS)
        return cudaFail(r, "cuCtxGetDevice");
    int major = 0;
    int minor = 0;
    if ((r = driver().deviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)) != CUDA_SUCCESS
        || (r = driver().deviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)) != CUDA_SUCCESS)
        return cudaFail(r, "cuDeviceGetAttribute");
    arch = major * 10 + minor;
    if (!name)
        return WIDE_OK;
    thread_local bool named = false;
    thread_local CUdevice namedDev = 0;
    thread_local std::string devName;
    if (!named || namedDev != dev)
    {
        char buf[256] = {};
        if ((r = driver().deviceGetName(buf, static_cast<int>(sizeof(buf) - 1), dev)) != CUDA_SUCCESS)
            return cudaFail(r, "cuDeviceGetName");
        devName = buf;
        namedDev = dev;
        named = true;
    }
    *name = devName;
    return WIDE_OK;
}

//! Streaming multiprocessors of the current device (kDecodeSms when it cannot be read).
int64_t smCount()
{
    CUdevice dev;
    int n = 0;
    if (!driver().ok || driver().ctxGetDevice(&dev) != CUDA_SUCCESS
        || driver().deviceGetAttribute(&n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS || n <= 0)
        return kDecodeSms;
    return n;
}

//! The architecture whose cubins of key a device of `arch` runs: same major, highest compiled minor <= the
//! device's; -1 if none.
int cubinArch(std::string const& key, int arch)
{
    int best = -1;
    for (int i = 0; i < kNumCubins; ++i)
    {
        Cubin const& c = kCubins[i];
        if (key == c.key && c.arch / 10 == arch / 10 && c.arch <= arch && c.arch > best)
            best = c.arch;
    }
    return best;
}

//! Kernel arguments in declaration order (pointers and i32 scalars, as the Triton kernel declares them).
class Args
{
public:
    Args& ptr(void const* p)
    {
        mPtrs.push_back(reinterpret_cast<CUdeviceptr>(p));
        mValues.push_back(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)));
        mKinds.push_back(0);
        return *this;
    }
    Args& i32(int64_t v)
    {
        mInts.push_back(static_cast<int32_t>(v));
        mValues.push_back(static_cast<uint64_t>(v));
        mKinds.push_back(1);
        return *this;
    }
    Args& f32(float v)
    {
        mFloats.push_back(v);
        uint32_t bits = 0;
        std::memcpy(&bits, &v, sizeof bits);
        mValues.push_back(bits);
        mKinds.push_back(2);
        return *this;
    }
    size_t size() const
    {
        return mKinds.size();
    }
    //! Whether every argument named by `mask` (bit i = argument i) is a multiple of `align`.
    bool meets(uint32_t mask, unsigned align) const
    {
        for (size_t i = 0; i < mValues.size() && i < 32; ++i)
        {
            if ((mask >> i & 1u) && mValues[i] % align != 0)
                return false;
        }
        return true;
    }
    std::vector<void*> build()
    {
        std::vector<void*> out;
        size_t p = 0;
        size_t i = 0;
        size_t f = 0;
        for (int k : mKinds)
            out.push_back(k == 0 ? static_cast<void*>(&mPtrs[p++])
                    : k == 1     ? static_cast<void*>(&mInts[i++])
                                 : static_cast<void*>(&mFloats[f++]));
        out.push_back(&mScratch[0]); // Triton's global / profile scratch pointers (size 0: aot.py checks)
        out.push_back(&mScratch[1]);
        return out;
    }

private:
    std::vector<CUdeviceptr> mPtrs;
    std::vector<int32_t> mInts;
    std::vector<float> mFloats;
    std::vector<uint64_t> mValues; // every argument as an unsigned value, for the alignment check
    std::vector<int> mKinds;
    CUdeviceptr mScratch[2] = {0, 0};
};

//! The cubin to launch for key with these arguments on a device of `arch`: the aligned variant when
//! every argument it was compiled to assume aligned is, else the variant that assumes nothing; -1 if none.
int pickCubin(std::string const& key, int arch, Args const& args)
{
    int const use = cubinArch(key, arch);
    int safe = -1;
    for (int i = 0; use >= 0 && i < kNumCubins; ++i)
    {
        Cubin const& c = kCubins[i];
        if (key != c.key || c.arch != use)
            continue;
        if (c.align > 1 && args.meets(c.hintMask, c.align))
            return i;
        if (c.align <= 1)
            safe = i;
    }
    return safe;
}

std::mutex gMutex;
std::map<std::pair<CUcontext, int>, CUfunction> gFunctions;

int function(int index, CUfunction& fn)
{
    CUcontext ctx = nullptr;
    CUresult r = driver().ctxGetCurrent(&ctx);
    if (r != CUDA_SUCCESS)
        return cudaFail(r, "cuCtxGetCurrent");
    std::lock_guard<std::mutex> lock(gMutex);
    auto it = gFunctions.find({ctx, index});
    if (it != gFunctions.end())
    {
        fn = it->second;
        return WIDE_OK;
    }
    Cubin const& c = kCubins[index];
    CUmodule mod;
    if ((r = driver().moduleLoadData(&mod, wide_aot_blob + c.offset)) != CUDA_SUCCESS)
        return cudaFail(r, "cuModuleLoadData");
    if ((r = driver().moduleGetFunction(&fn, mod, c.name)) != CUDA_SUCCESS)
        return cudaFail(r, "cuModuleGetFunction");
    if (c.shared > 49152
        && (r = driver().funcSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(c.shared)))
            != CUDA_SUCCESS)
        return cudaFail(r, "cuFuncSetAttribute");
    gFunctions[{ctx, index}] = fn;
    return WIDE_OK;
}

//! y (row-major [M, N], row stride ldc) = x (row-major [M, K], row stride ldx) W^T (W row-major [N, K])
//! (+ bias[N]), by cuBLASLt in column-major terms: C (N x M) = op_T(W: K x N) * x^T (K x M).
struct DenseGemm
{
    void const* w = nullptr;
    void const* x = nullptr;
    void* y = nullptr;
    void const* bias = nullptr;
    int64_t M = 0, N = 0, K = 0, ldx = 0, ldc = 0;
    wide_dtype_t dtype = WIDE_FLOAT32;
    void* ws = nullptr; // cuBLASLt's scratch, kLtWorkspace bytes
};

//! One step of a GEMM: a kernel launch (key, grid, arguments), a memset of the workspace, or a cuBLASLt GEMM.
struct Step
{
    std::string key; // empty: cuMemsetD8Async(memsetPtr, 0, memsetBytes), or the dense GEMM when isDense
    unsigned grid[3] = {1, 1, 1};
    Args args;
    void* memsetPtr = nullptr;
    size_t memsetBytes = 0;
    bool isDense = false;
    DenseGemm dense;
};
using Plan = std::vector<Step>;

Step kernel(std::string key, unsigned gx, unsigned gy, unsigned gz, Args args)
{
    Step s;
    s.key = std::move(key);
    s.grid[0] = gx;
    s.grid[1] = gy;
    s.grid[2] = gz;
    s.args = std::move(args);
    return s;
}

#ifdef WIDE_HAVE_CUBLASLT
std::mutex gLtMutex;
std::map<CUcontext, cublasLtHandle_t> gLtHandles;
std::map<std::string, cublasLtMatmulAlgo_t> gLtAlgos; // heuristic results per (context, problem, alignment)

int ltFail(cublasStatus_t st, char const* what)
{
    tLastCudaError = std::string(what) + ": " + lt().statusString(st);
    return WIDE_ERR_CUDA;
}

//! RAII for the cuBLASLt descriptors of one call.
struct LtDescs
{
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~LtDescs()
    {
        if (pref)
            lt().prefDestroy(pref);
        for (cublasLtMatrixLayout_t l : {a, b, c})
        {
            if (l)
                lt().layoutDestroy(l);
        }
        if (op)
            lt().descDestroy(op);
    }
};

int runDense(DenseGemm const& g, cudaStream_t stream)
{
    if (!haveLt())
    {
        tLastCudaError = "cuBLASLt (libcublasLt) could not be loaded";
        return WIDE_ERR_NO_KERNEL;
    }
    CUcontext ctx = nullptr;
    CUresult cr = driver().ctxGetCurrent(&ctx);
    if (cr != CUDA_SUCCESS)
        return cudaFail(cr, "cuCtxGetCurrent");
    Lt const& L = lt();
    cublasLtHandle_t handle = nullptr;
    {
        std::lock_guard<std::mutex> lock(gLtMutex);
        auto it = gLtHandles.find(ctx);
        if (it == gLtHandles.end())
        {
            if (cublasStatus_t st = L.create(&handle); st != CUBLAS_STATUS_SUCCESS)
                return ltFail(st, "cublasLtCreate");
            it = gLtHandles.emplace(ctx, handle).first;
        }
        handle = it->second;
    }
    cudaDataType_t const t
        = g.dtype == WIDE_FLOAT16 ? CUDA_R_16F : (g.dtype == WIDE_BFLOAT16 ? CUDA_R_16BF : CUDA_R_32F);
    LtDescs d;
    cublasOperation_t const ta = CUBLAS_OP_T;
    cublasOperation_t const tb = CUBLAS_OP_N;
    cublasStatus_t st = L.descCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F); // fp32: no TF32, as the references
    if (st == CUBLAS_STATUS_SUCCESS)
        st = L.descSet(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = L.descSet(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (st == CUBLAS_STATUS_SUCCESS && g.bias)
    {
        cublasLtEpilogue_t const epi = CUBLASLT_EPILOGUE_BIAS;
        st = L.descSet(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = L.descSet(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias);
    }
    if (st == CUBLAS_STATUS_SUCCESS)
        st = L.layoutCreate(&d.a, t, static_cast<uint64_t>(g.K), static_cast<uint64_t>(g.N), g.K);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = L.layoutCreate(&d.b, t, static_cast<uint64_t>(g.K), static_cast<uint64_t>(g.M), g.ldx);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = L.layoutCreate(&d.c, t, static_cast<uint64_t>(g.N), static_cast<uint64_t>(g.M), g.ldc);
    if (st != CUBLAS_STATUS_SUCCESS)
        return ltFail(st, "cuBLASLt descriptors");
    auto mis = [](void const* p) { return std::to_string(reinterpret_cast<uintptr_t>(p) % 16); };
    std::string const key = std::to_string(reinterpret_cast<uintptr_t>(ctx)) + "/" + std::to_string(g.dtype) + "/"
        + std::to_string(g.M) + "x" + std::to_string(g.N) + "x" + std::to_string(g.K) + "/" + std::to_string(g.ldx)
        + "/" + std::to_string(g.ldc) + "/" + (g.bias ? "b" + mis(g.bias) : "-") + "/" + mis(g.w) + mis(g.x) + mis(g.y);
    cublasLtMatmulAlgo_t algo;
    bool cached = false;
    {
        std::lock_guard<std::mutex> lock(gLtMutex);
        auto it = gLtAlgos.find(key);
        if ((cached = it != gLtAlgos.end()))
            algo = it->second;
    }
    if (!cached)
    {
        size_t const wsBytes = kLtWorkspace;
        st = L.prefCreate(&d.pref);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = L.prefSet(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes, sizeof wsBytes);
        cublasLtMatmulHeuristicResult_t res;
        std::memset(&res, 0, sizeof res);
        int found = 0;
        if (st == CUBLAS_STATUS_SUCCESS)
            st = L.heuristic(handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &res, &found);
        if (st != CUBLAS_STATUS_SUCCESS)
            return ltFail(st, "cublasLtMatmulAlgoGetHeuristic");
        if (found == 0)
        {
            tLastCudaError = "cublasLtMatmulAlgoGetHeuristic found no algorithm for " + key;
            return WIDE_ERR_NO_KERNEL;
        }
        algo = res.algo;
        std::lock_guard<std::mutex> lock(gLtMutex);
        gLtAlgos[key] = algo;
    }
    float const alpha = 1.0f;
    float const beta = 0.0f;
    st = L.matmul(handle, d.op, &alpha, g.w, d.a, g.x, d.b, &beta, g.y, d.c, g.y, d.c, &algo, g.ws, kLtWorkspace,
        stream);
    return st == CUBLAS_STATUS_SUCCESS ? WIDE_OK : ltFail(st, "cublasLtMatmul");
}
#else
int runDense(DenseGemm const&, cudaStream_t)
{
    tLastCudaError = "this build of wide_kernels has no cuBLASLt (cublasLt.h was not found at configure time)";
    return WIDE_ERR_NO_KERNEL;
}
#endif

Step denseStep(DenseGemm const& g)
{
    Step s;
    s.isDense = true;
    s.dense = g;
    return s;
}

int launch(Step& step, int arch, cudaStream_t stream)
{
    if (step.isDense)
        return runDense(step.dense, stream);
    if (step.key.empty())
    {
        CUresult r = driver().memsetD8Async(
            reinterpret_cast<CUdeviceptr>(step.memsetPtr), 0, step.memsetBytes, reinterpret_cast<CUstream>(stream));
        return r == CUDA_SUCCESS ? WIDE_OK : cudaFail(r, "cuMemsetD8Async");
    }
    if (step.grid[0] == 0 || step.grid[1] == 0 || step.grid[2] == 0)
        return WIDE_OK;
    int const index = pickCubin(step.key, arch, step.args);
    if (index < 0)
    {
        tLastCudaError = "no cubin for " + step.key + " on sm_" + std::to_string(arch);
        return WIDE_ERR_NO_KERNEL;
    }
    Cubin const& c = kCubins[index];
    if (step.args.size() != static_cast<size_t>(c.nparams))
    {
        tLastCudaError = step.key + ": " + std::to_string(step.args.size()) + " arguments for a kernel of "
            + std::to_string(c.nparams) + " (triton_kernels.py and wide_kernels.cpp disagree)";
        return WIDE_ERR_INVALID_ARGUMENT;
    }
    CUfunction fn;
    if (int s = function(index, fn))
        return s;
    std::vector<void*> params = step.args.build();
    CUresult r = driver().launchKernel(fn, step.grid[0], step.grid[1], step.grid[2], c.warps * 32, 1, 1, c.shared,
        reinterpret_cast<CUstream>(stream), params.data(), nullptr);
    return r == CUDA_SUCCESS ? WIDE_OK : cudaFail(r, step.key.c_str());
}

int run(Plan& plan, int arch, cudaStream_t stream)
{
    for (Step& step : plan)
    {
        if (int s = launch(step, arch, stream))
            return s;
    }
    return WIDE_OK;
}

//! "key@variant grid=XxYxZ" per launch ("memset BYTES" per memset), space-separated: what run() would do.
std::string describe(Plan const& plan, int arch)
{
    std::string out;
    for (Step const& step : plan)
    {
        if (!out.empty())
            out += ' ';
        if (step.isDense)
        {
            DenseGemm const& g = step.dense;
            out += "cublasLt" + std::string(g.bias ? "+bias" : "") + " " + std::to_string(g.M) + "x"
                + std::to_string(g.N) + "x" + std::to_string(g.K);
            continue;
        }
        if (step.key.empty())
        {
            out += "memset " + std::to_string(step.memsetBytes);
            continue;
        }
        int const index = pickCubin(step.key, arch, step.args);
        out += step.key + "@" + (index < 0 ? "none" : kCubins[index].align > 1 ? "a16" : "any");
        if (index >= 0 && step.args.size() != static_cast<size_t>(kCubins[index].nparams))
        { // what launch() refuses on a GPU, shown without one
            out += "!args=" + std::to_string(step.args.size()) + "/" + std::to_string(kCubins[index].nparams);
        }
        out += " grid=" + std::to_string(step.grid[0]) + "x" + std::to_string(step.grid[1]) + "x"
            + std::to_string(step.grid[2]);
    }
    return out;
}

//! describe(plan) written NUL-terminated into out (WIDE_ERR_INVALID_ARGUMENT when it does not fit).
int describeInto(Plan const& plan, int arch, char* out, size_t outSize)
{
    std::string const text = describe(plan, arch);
    if (!out || outSize <= text.size())
        return WIDE_ERR_INVALID_ARGUMENT;
    text.copy(out, text.size());
    out[text.size()] = '\0';
    return WIDE_OK;
}

unsigned cdiv(int64_t a, int64_t b)
{
    return static_cast<unsigned>((a + b - 1) / b);
}

size_t align256(size_t v)
{
    return (v + 255) / 256 * 256;
}

//! The policy of a device of `arch` named `device`: policy.json's "sm_<arch>@<device>" entry (a measurement
//! on that very GPU model), else "sm_<arch>", else "default" (policy.policy_for).
Policy policyFor(int arch, std::string const& device)
{
    Policy p = kPolicies[0];
    for (Policy const& q : kPolicies)
    {
        if (q.arch == 0)
            p = q;
    }
    bool archEntry = false;
    for (Policy const& q : kPolicies)
    {
        if (q.arch != arch)
            continue;
        if (!device.empty() && device == q.device)
            return q;
        if (!q.device[0] && !archEntry)
        {
            p = q;
            archEntry = true;
        }
    }
    return p;
}

int groupedBlockN(int64_t gs)
{
    for (int b : kGroupedBlockNs)
    {
        if (gs % b == 0)
            return b;
    }
    return 0;
}

int64_t gemvMaxM(Policy const& pol, wide_gemm_params_t const* p, bool kindK, bool gated)
{
    char const kind = kindK ? 'k' : (gated ? 'g' : 'n');
    for (ShapeRule const& r : pol.shapes)
    {
        if (r.kind == kind && r.N == p->N && r.K == p->K)
            return r.gemvMaxM;
    }
    return kindK ? pol.gemvMaxMK : (gated ? pol.gemvMaxMGated : pol.gemvMaxMN);
}

int resolve(wide_gemm_params_t const* p, bool kindK, bool gated, Policy const& pol)
{
    bool const fp32 = p->dtype == WIDE_FLOAT32; // no grouped cubins for float32 (aot.specs)
    if (p->algo != WIDE_ALGO_AUTO)
        return p->algo;
    if (p->M <= gemvMaxM(pol, p, kindK, gated))
        return WIDE_ALGO_GEMV;
    int const fallback = pol.fallbackDense && haveLt() ? WIDE_ALGO_DENSE : WIDE_ALGO_TILE;
    if (!fp32 && kindK && p->M >= pol.groupedKMinM && p->group_size >= pol.groupedKMinGs)
        return WIDE_ALGO_GROUPED;
    if (!fp32 && !kindK && p->M >= pol.groupedNMinM && p->group_size >= pol.groupedNMinGs
        && groupedBlockN(p->group_size))
        return WIDE_ALGO_GROUPED;
    return fallback; // policy.json's fallback; "dense" needs cuBLASLt (else the tile kernels)
}

int validate(wide_gemm_params_t const* p, bool kindK, bool gated)
{
    if (!p || !p->x || !p->w || !p->mask || !p->y || p->M < 0 || p->N <= 0 || p->K <= 0 || p->group_size <= 0)
        return WIDE_ERR_INVALID_ARGUMENT;
    if (!dtypeName(p->dtype))
        return WIDE_ERR_UNSUPPORTED_DTYPE;
    if ((kindK ? p->K : p->N) % p->group_size != 0)
        return WIDE_ERR_INVALID_ARGUMENT;
    if (gated != (p->w2 != nullptr))
        return WIDE_ERR_INVALID_ARGUMENT;
    if (p->algo < WIDE_ALGO_AUTO || p->algo > WIDE_ALGO_DENSE)
        return WIDE_ERR_INVALID_ARGUMENT;
    if (p->algo == WIDE_ALGO_GROUPED && (p->dtype == WIDE_FLOAT32 || (!kindK && !groupedBlockN(p->group_size))))
        return WIDE_ERR_INVALID_ARGUMENT;
    // the kernels index with i32
    int64_t const lim = int64_t{1} << 31;
    if (p->M * p->K >= lim || p->M * p->N >= lim || p->N * p->K >= lim)
        return WIDE_ERR_INVALID_ARGUMENT;
    return WIDE_OK;
}

//! {splits, chunks per split} of `chunks` K chunks over `programs` output programs (mirrors launch._split).
std::pair<int64_t, int64_t> splitPlan(int64_t programs, int64_t chunks, int64_t sms, int64_t maxSplits)
{
    int64_t want = (kDecodeTargetWaves * sms + programs - 1) / programs;
    int64_t splits = want < 1 ? 1 : want;
    splits = splits < chunks ? splits : chunks;
    splits = splits < maxSplits ? splits : maxSplits;
    splits = splits < 1 ? 1 : splits;
    int64_t const per = (chunks + splits - 1) / splits;
    return {(chunks + per - 1) / per, per};
}

//! The split-K GEMVs' plans (mirror launch.gemv_k_plan / gemv_n_plan).
std::pair<int64_t, int64_t> gemvKPlan(int64_t M, int64_t N, int64_t K, int64_t sms, int64_t maxSplits)
{
    return splitPlan(M * ((N + kGemvKBlockN - 1) / kGemvKBlockN), (K + kGemvKBlockK - 1) / kGemvKBlockK, sms,
        maxSplits);
}

std::pair<int64_t, int64_t> gemvNPlan(int64_t M, int64_t N, int64_t K, int64_t sms, int64_t maxSplits)
{
    return splitPlan(M * ((N + kGemvBlockN - 1) / kGemvBlockN), (K + kGemvBlockK - 1) / kGemvBlockK, sms,
        maxSplits);
}

//! The fused router's BLOCK_R: the smallest compiled one >= R (configs.router_block_r); 0 if R is too wide.
int routerBlockR(int64_t R)
{
    for (int b : kRouterBlockRs)
    {
        if (R <= b)
            return b;
    }
    return 0;
}

//! Splits of the split router (mirrors launch.router_plan): {splits, H chunks per split}; M <= kRouterSplitMaxM.
std::pair<int64_t, int64_t> routerPlan(int64_t M, int64_t H, int64_t R, int64_t sms)
{
    int64_t const programs = ((M + kRouterSplitBlockM - 1) / kRouterSplitBlockM) * ((R + kRouterSplitBlockR - 1) / kRouterSplitBlockR);
    int64_t const chunks = (H + kRouterSplitBlockH - 1) / kRouterSplitBlockH;
    int64_t want = (kDecodeTargetWaves * sms + programs - 1) / programs;
    int64_t splits = want < 1 ? 1 : (want < chunks ? want : chunks);
    int64_t const per = (chunks + splits - 1) / splits;
    return {(chunks + per - 1) / per, per};
}

//! Float32 rows [S * M] the split-K partials of any M' <= M need (the GEMV runs at small M only).
int64_t splitRows(int64_t M, int64_t N, int64_t K)
{
    int64_t most = 0;
    int64_t const sms = smCount();
    for (int64_t m = 1; m <= M && m <= 64; ++m)
    {
        int64_t const rk = gemvKPlan(m, N, K, sms, int64_t{1} << 30).first * m;
        int64_t const rn = 2 * gemvNPlan(m, N, K, sms, int64_t{1} << 30).first * m; // gated: gate + up partials
        most = rk > most ? rk : most;
        most = rn > most ? rn : most;
    }
    return most;
}

size_t rowsBytes(int64_t M, int64_t G)
{
    return align256(static_cast<size_t>(G) * M * 4) + align256(static_cast<size_t>(G) * 4);
}

Step groupRows(int32_t const* mask, int64_t M, int64_t G, void* ws)
{
    auto* rows = static_cast<int32_t*>(ws);
    auto* counts = reinterpret_cast<int32_t*>(static_cast<char*>(ws) + align256(static_cast<size_t>(G) * M * 4));
    Args a;
    a.ptr(mask).ptr(rows).ptr(counts).i32(M).i32(G);
    return kernel("group_rows", static_cast<unsigned>(G), 1, 1, std::move(a));
}

//! The size class (configs.SIZES index) the policy's prefill_tiles buckets give a `family` GEMM of M rows.
int bucketSize(Policy const& pol, int family, int64_t M)
{
    TileBuckets const& t = pol.tiles[family];
    int size = 0;
    for (int i = 0; i < t.n && i < kMaxTileBuckets; ++i)
    {
        if (M >= t.minM[i])
            size = t.cls[i];
    }
    return size;
}

//! `key` + the suffix of the size class a prefill of M rows takes on `arch` (size: its index): the policy's
//! bucket, stepped down to the largest class with a cubin these arguments can launch (the "/large" and
//! "/wide" ones exist for fp16 / bf16 on sm_90 only, "/wide" in the a16 variant only), as
//! configs.size_for does for the JIT path; "small" (the key itself) always exists.
std::string sized(std::string const& key, int family, int64_t M, int arch, Policy const& pol, Args const& args,
    int& size)
{
    for (size = bucketSize(pol, family, M); size > 0; --size)
    {
        if (pickCubin(key + kSizeSuffix[size], arch, args) >= 0)
            return key + kSizeSuffix[size];
    }
    return key;
}

//! The launches of wide_gemm_n / _gated for a validated, non-empty problem on `arch`.
int planN(wide_gemm_params_t const* p, bool gated, void* ws, size_t wsSize, int arch, Policy const& pol, Plan& plan)
{
    std::string const dt = dtypeName(p->dtype);
    std::string const var = gated ? "gated" : (p->bias ? "bias" : "plain");
    int64_t const G = p->N / p->group_size;
    void const* w2 = gated ? p->w2 : p->w; // never read when the variant does not use it
    void const* b = p->bias ? p->bias : p->w;
    int const algo = resolve(p, false, gated, pol);
    Args a;
    if (algo == WIDE_ALGO_GEMV)
    {
        // split-K: float32 partials [S, M, N] (gated: gate then up) in the workspace, as many splits as it holds
        size_t const slab = static_cast<size_t>(p->M) * p->N * 4 * (gated ? 2 : 1);
        int64_t const room = ws ? static_cast<int64_t>(wsSize / slab) : 0;
        auto const sp = gemvNPlan(p->M, p->N, p->K, smCount(), room > 1 ? room : 1);
        a.ptr(p->x).ptr(p->w).ptr(w2).ptr(b).ptr(p->mask).ptr(p->y).ptr(sp.first > 1 ? ws : p->y);
        a.i32(p->M).i32(p->N).i32(p->K).i32(G).i32(p->group_size).i32(p->K).i32(sp.second);
        plan.push_back(kernel("gemv_n/" + dt + "/" + var, static_cast<unsigned>(p->M), cdiv(p->N, kGemvBlockN),
            static_cast<unsigned>(sp.first), std::move(a)));
        if (sp.first == 1)
            return WIDE_OK;
        Args c; // the bias is in split 0's partial: the reduction adds none
        c.ptr(ws).ptr(b).ptr(p->y).i32(p->M * p->N).i32(p->N).i32(sp.first);
        plan.push_back(kernel("splitk_reduce/" + dt + (gated ? "/gated" : ""), cdiv(p->M * p->N, kSplitkReduceBlock),
            1, 1, std::move(c)));
        return WIDE_OK;
    }
    if (algo == WIDE_ALGO_GROUPED)
    {
        if (!ws || wsSize < rowsBytes(p->M, G))
            return WIDE_ERR_WORKSPACE_TOO_SMALL;
        plan.push_back(groupRows(p->mask, p->M, G, ws));
        int bn = groupedBlockN(p->group_size);
        std::string const base = "grouped_n/" + dt + "/" + var + "/bn";
        int const largeBn = gated && bn > kLargeGatedBlockN ? kLargeGatedBlockN : bn;
        auto* rows = static_cast<int32_t*>(ws);
        auto* counts = reinterpret_cast<int32_t*>(static_cast<char*>(ws) + align256(static_cast<size_t>(G) * p->M * 4));
        a.ptr(p->x).ptr(p->w).ptr(w2).ptr(b).ptr(rows).ptr(counts).ptr(p->y);
        a.i32(p->M).i32(p->N).i32(p->K).i32(p->group_size).i32(p->K);
        int size = 0; // grouped_n: small or large (the large gated tile is at most 64 wide: bn64's cubin)
        std::string key = sized(base + std::to_string(largeBn), gated ? kFamGroupedGated : kFamGroupedN, p->M, arch,
            pol, a, size);
        if (size > 0)
            bn = largeBn;
        else
            key = base + std::to_string(bn);
        plan.push_back(kernel(key, cdiv(p->M, size > 0 ? kLargeBlockM : kGroupedBlockM),
            static_cast<unsigned>(p->N / bn), 1, std::move(a)));
        return WIDE_OK;
    }
    if (algo == WIDE_ALGO_DENSE)
    {
        // y = x W^T (+ b) by cuBLASLt; gated: the up projection into the workspace, then one mask pass
        // (silu(gate) * up, exact zeros on skipped groups).
        size_t const upBytes = gated ? align256(static_cast<size_t>(p->M) * p->N * 4) : 0;
        if (!ws || wsSize < upBytes + kLtWorkspace)
            return WIDE_ERR_WORKSPACE_TOO_SMALL;
        void* up = ws;
        void* ltWs = static_cast<char*>(ws) + upBytes;
        DenseGemm g;
        g.w = p->w;
        g.x = p->x;
        g.y = p->y;
        g.bias = gated ? nullptr : p->bias;
        g.M = p->M;
        g.N = p->N;
        g.K = p->K;
        g.ldx = p->K;
        g.ldc = p->N;
        g.dtype = p->dtype;
        g.ws = ltWs;
        plan.push_back(denseStep(g));
        if (gated)
        {
            g.w = p->w2;
            g.y = up;
            plan.push_back(denseStep(g));
        }
        a.ptr(p->y).ptr(gated ? up : p->y).ptr(p->y).ptr(p->mask);
        a.i32(p->M).i32(p->N).i32(G).i32(p->group_size).i32(p->N);
        plan.push_back(kernel("apply_mask/" + dt + (gated ? "/gated" : "/plain"), cdiv(p->M, kApplyMaskBlockM),
            cdiv(p->N, kApplyMaskBlockN), 1, std::move(a)));
        return WIDE_OK;
    }
    a.ptr(p->x).ptr(p->w).ptr(w2).ptr(b).ptr(p->mask).ptr(p->y);
    a.i32(p->M).i32(p->N).i32(p->K).i32(G).i32(p->group_size).i32(p->K);
    int size = 0;
    std::string const key
        = sized("tile_n/" + dt + "/" + var, gated ? kFamTileGated : kFamTileN, p->M, arch, pol, a, size);
    plan.push_back(
        kernel(key, cdiv(p->M, kTileSizeBlockM[size]), cdiv(p->N, tileBlockN(size, gated)), 1, std::move(a)));
    return WIDE_OK;
}

//! The launches of wide_gemm_k for a validated, non-empty problem on `arch`.
int planK(wide_gemm_params_t const* p, void* workspace, size_t workspaceSize, int arch, Policy const& pol, Plan& plan)
{
    std::string const dt = dtypeName(p->dtype);
    std::string const var = p->bias ? "/bias" : ""; // the bias [N] is added to every output (outputs are not grouped)
    void const* b = p->bias ? p->bias : p->w;       // never read by the plain variants
    int64_t const G = p->K / p->group_size;
    int const algo = resolve(p, true, false, pol);
    Args a;
    if (algo == WIDE_ALGO_GEMV)
    {
        // split-K: float32 partials [S, M, N] in the workspace (as many splits as it holds), summed in split order
        size_t const slab = static_cast<size_t>(p->M) * p->N * 4;
        int64_t const room = workspace ? static_cast<int64_t>(workspaceSize / slab) : 0;
        auto const sp = gemvKPlan(p->M, p->N, p->K, smCount(), room > 1 ? room : 1);
        a.ptr(p->x).ptr(p->w).ptr(b).ptr(p->mask).ptr(p->y).ptr(sp.first > 1 ? workspace : p->y);
        a.i32(p->M).i32(p->N).i32(p->K).i32(G).i32(p->group_size).i32(p->K).i32(sp.second);
        plan.push_back(kernel("gemv_k/" + dt + var, static_cast<unsigned>(p->M), cdiv(p->N, kGemvKBlockN),
            static_cast<unsigned>(sp.first), std::move(a)));
        if (sp.first == 1)
            return WIDE_OK;
        Args c;
        c.ptr(workspace).ptr(b).ptr(p->y).i32(p->M * p->N).i32(p->N).i32(sp.first);
        plan.push_back(kernel("splitk_reduce/" + dt + var, cdiv(p->M * p->N, kSplitkReduceBlock), 1, 1, std::move(c)));
        return WIDE_OK;
    }
    if (algo == WIDE_ALGO_GROUPED)
    {
        size_t const rb = rowsBytes(p->M, G);
        size_t const accBytes = static_cast<size_t>(p->M) * p->N * 4;
        if (!workspace || workspaceSize < rb + align256(accBytes))
            return WIDE_ERR_WORKSPACE_TOO_SMALL;
        plan.push_back(groupRows(p->mask, p->M, G, workspace));
        auto* rows = static_cast<int32_t*>(workspace);
        auto* counts
            = reinterpret_cast<int32_t*>(static_cast<char*>(workspace) + align256(static_cast<size_t>(G) * p->M * 4));
        void* acc = static_cast<char*>(workspace) + rb;
        Step zero;
        zero.memsetPtr = acc;
        zero.memsetBytes = accBytes;
        plan.push_back(std::move(zero));
        a.ptr(p->x).ptr(p->w).ptr(rows).ptr(counts).ptr(acc).i32(p->M).i32(p->N).i32(p->K).i32(p->group_size).i32(p->K);
        plan.push_back(kernel("grouped_k/" + dt, cdiv(p->M, kGroupedBlockM), cdiv(p->N, kGroupedKBlockN),
            static_cast<unsigned>(G), std::move(a)));
        Args c;
        c.ptr(acc).ptr(p->y).ptr(b).i32(p->M * p->N).i32(p->N);
        plan.push_back(kernel("cast/" + dt + var, cdiv(p->M * p->N, kCastBlock), 1, 1, std::move(c)));
        return WIDE_OK;
    }
    if (algo == WIDE_ALGO_DENSE)
    {
        // x with skipped input groups zeroed into the workspace (one mask pass), then y = x' W^T (+ b) by cuBLASLt.
        size_t const xBytes = align256(static_cast<size_t>(p->M) * p->K * 4);
        if (!workspace || workspaceSize < xBytes + kLtWorkspace)
            return WIDE_ERR_WORKSPACE_TOO_SMALL;
        void* xm = workspace;
        a.ptr(p->x).ptr(p->x).ptr(xm).ptr(p->mask);
        a.i32(p->M).i32(p->K).i32(G).i32(p->group_size).i32(p->K);
        plan.push_back(kernel("apply_mask/" + dt + "/plain", cdiv(p->M, kApplyMaskBlockM), cdiv(p->K, kApplyMaskBlockN),
            1, std::move(a)));
        DenseGemm g;
        g.w = p->w;
        g.x = xm;
        g.y = p->y;
        g.bias = p->bias;
        g.M = p->M;
        g.N = p->N;
        g.K = p->K;
        g.ldx = p->K;
        g.ldc = p->N;
        g.dtype = p->dtype;
        g.ws = static_cast<char*>(workspace) + xBytes;
        plan.push_back(denseStep(g));
        return WIDE_OK;
    }
    a.ptr(p->x).ptr(p->w).ptr(b).ptr(p->mask).ptr(p->y);
    a.i32(p->M).i32(p->N).i32(p->K).i32(G).i32(p->group_size).i32(p->K);
    int size = 0;
    std::string const key = sized("tile_k/" + dt + var, kFamTileK, p->M, arch, pol, a, size);
    plan.push_back(
        kernel(key, cdiv(p->M, kTileSizeBlockM[size]), cdiv(p->N, tileBlockN(size, false)), 1, std::move(a)));
    return WIDE_OK;
}

//! Validation, then the plan of operation `op` (WIDE_OP_*) on a device of `arch` named `device` ("": any); an
//! empty plan for M == 0.
int plan(int op, wide_gemm_params_t const* p, void* ws, size_t wsSize, int arch, std::string const& device, Plan& out)
{
    bool const kindK = op == WIDE_OP_GEMM_K;
    bool const gated = op == WIDE_OP_GEMM_N_GATED;
    if (op < WIDE_OP_GEMM_N || op > WIDE_OP_GEMM_K)
        return WIDE_ERR_INVALID_ARGUMENT;
    if (int s = validate(p, kindK, gated))
        return s;
    if (p->M == 0)
        return WIDE_OK;
    if (p->algo == WIDE_ALGO_DENSE && !haveLt())
    {
        tLastCudaError = kLtWorkspace ? "cuBLASLt (libcublasLt) could not be loaded (set WIDE_CUBLASLT_LIBRARY)"
                                      : "this build has no cuBLASLt dense path (cublasLt.h not found at configure time)";
        return WIDE_ERR_NO_KERNEL;
    }
    Policy const pol = policyFor(arch, device);
    return kindK ? planK(p, ws, wsSize, arch, pol, out) : planN(p, gated, ws, wsSize, arch, pol, out);
}

int gemm(int op, wide_gemm_params_t const* p, void* ws, size_t wsSize, cudaStream_t stream)
{
    if (int s = validate(p, op == WIDE_OP_GEMM_K, op == WIDE_OP_GEMM_N_GATED))
        return s; // before any CUDA call
    if (p->M == 0)
        return WIDE_OK;
    int arch = 0;
    std::string device;
    if (int s = deviceArch(arch, &device))
        return s;
    Plan steps;
    if (int s = plan(op, p, ws, wsSize, arch, device, steps))
        return s;
    return run(steps, arch, stream);
}

//! (splits, key tiles per split) of a decode call: attention.plan_splits.
std::pair<int64_t, int64_t> attnSplits(int64_t B, int64_t Hk, int64_t S)
{
    int64_t const tiles = std::max<int64_t>(1, (S + kAttnDecodeBlockL - 1) / kAttnDecodeBlockL);
    int64_t splits = std::max<int64_t>(1,
        std::min<int64_t>({tiles, kAttnTargetPrograms / std::max<int64_t>(1, B * Hk), int64_t{kAttnMaxSplits}}));
    int64_t const per = (tiles + splits - 1) / splits;
    return {(tiles + per - 1) / per, per};
}

//! Workspace of a decode call split `splits` ways: float32 partials acc [splits, B, Hq, D], max and sum
//! [splits, B, Hq] (none for one split).
size_t attnPartialBytes(int64_t splits, int64_t B, int64_t Hq, int64_t D)
{
    if (splits <= 1)
        return 0;
    size_t const rows = static_cast<size_t>(splits) * B * Hq;
    return align256(rows * D * 4) + 2 * align256(rows * 4);
}

//! The sizes (and, with `pointers`, the tensors) of a call; its head-size class in blockD.
int attentionCheck(wide_attention_params_t const* p, int& blockD, bool pointers = true)
{
    if (!p || (pointers && (!p->q || !p->k || !p->v || !p->allowed || !p->head_mask || !p->y)) || p->B <= 0 || p->Hq <= 0
        || p->Hk <= 0 || p->T <= 0 || p->S < p->T || p->D <= 0 || p->group_heads <= 0 || p->Hq % p->Hk
        || p->Hq % p->group_heads)
        return WIDE_ERR_INVALID_ARGUMENT;
    if (!dtypeName(p->dtype))
        return WIDE_ERR_UNSUPPORTED_DTYPE;
    blockD = 0;
    for (int d : kAttnBlockDs)
    {
        if (!blockD && p->D <= d)
            blockD = d;
    }
    int64_t const big = int64_t{1} << 31;
    if (!blockD || p->B * p->Hq >= 65536 || p->B * p->Hq * p->T * p->D >= big || p->B * p->Hk * p->S * p->D >= big
        || p->B * p->T * p->S >= big || int64_t{kAttnMaxSplits} * p->B * p->Hq * p->D >= big)
        return WIDE_ERR_INVALID_ARGUMENT; // head size over the cubins', a grid or an offset past int32
    return WIDE_OK;
}

//! One query per sequence with a GQA ratio the decode tile holds: the decode kernel, split over the keys
//! when the workspace holds the partials (else one split), then the reduction.
bool attnDecodes(wide_attention_params_t const* p)
{
    return p->T == 1 && p->Hq / p->Hk <= kAttnDecodeBlockH;
}

int attentionPlan(wide_attention_params_t const* p, void* ws, size_t wsSize, Plan& plan)
{
    int blockD = 0;
    if (int s = attentionCheck(p, blockD))
        return s;
    std::string const dt = dtypeName(p->dtype);
    std::string const dsuffix = "/d" + std::to_string(blockD);
    int64_t const T = p->T, S = p->S, D = p->D, B = p->B, Hq = p->Hq, Hk = p->Hk;
    float const scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    if (attnDecodes(p))
    {
        auto sp = attnSplits(B, Hk, S);
        size_t const need = attnPartialBytes(sp.first, B, Hq, D);
        if (need && (!ws || wsSize < need))
            sp = {1, (S + kAttnDecodeBlockL - 1) / kAttnDecodeBlockL}; // no room for partials: one split
        bool const split = sp.first > 1;
        size_t const rows = static_cast<size_t>(sp.first) * B * Hq;
        void* pacc = split ? ws : p->y;
        void* pm = split ? static_cast<char*>(ws) + align256(rows * D * 4) : p->y;
        void* pl = split ? static_cast<char*>(pm) + align256(rows * 4) : p->y;
        Args a;
        a.ptr(p->q).ptr(p->k).ptr(p->v).ptr(p->y).ptr(p->allowed).ptr(p->head_mask).ptr(p->y).ptr(pacc).ptr(pm).ptr(pl);
        a.i32(Hq).i32(Hq / p->group_heads).i32(D).i32(Hq / Hk).i32(S).i32(S);      // Hq, G, D, REP, S, sab
        a.i32(Hq * D).i32(D).i32(Hk * S * D).i32(S * D).i32(Hk * S * D).i32(S * D); // q [B, Hq, 1, D]; k, v
        a.f32(scale).i32(sp.second);
        plan.push_back(kernel("masked_decode/" + dt + dsuffix + (split ? "/split" : ""), static_cast<unsigned>(B),
            static_cast<unsigned>(Hk), static_cast<unsigned>(sp.first), std::move(a)));
        if (split)
        {
            Args r;
            r.ptr(pacc).ptr(pm).ptr(pl).ptr(p->y).i32(sp.first).i32(B * Hq).i32(D);
            plan.push_back(kernel("attention_reduce/" + dt + dsuffix, static_cast<unsigned>(B * Hq), 1, 1, std::move(r)));
        }
        return WIDE_OK;
    }
    if (D % 16)
        return WIDE_ERR_INVALID_ARGUMENT; // the prefill tile's cubins are a16 only: head sizes a multiple of 16
    Args a;
    a.ptr(p->q).ptr(p->k).ptr(p->v).ptr(p->allowed).ptr(p->head_mask).ptr(p->y);
    a.i32(T).i32(S).i32(S - T).i32(Hq).i32(Hq / p->group_heads).i32(D).i32(Hq / Hk); // past = S - T
    a.i32(Hq * T * D).i32(T * D).i32(D);                     // q [B, Hq, T, D]
    a.i32(Hk * S * D).i32(S * D).i32(Hk * S * D).i32(S * D); // k, v [B, Hk, S, D]
    a.i32(T * S).i32(S);                                     // allowed [B, 1, T, S]
    a.i32(Hq * T * D).i32(T * D).i32(D);                     // y [B, Hq, T, D]
    a.f32(scale);
    plan.push_back(kernel("masked_attention/" + dt + dsuffix, cdiv(T, kAttnBlockM), static_cast<unsigned>(B * Hq), 1,
        std::move(a)));
    return WIDE_OK;
}

} // namespace

extern "C" {

char const* wide_status_string(int status)
{
    switch (status)
    {
    case WIDE_OK: return "ok";
    case WIDE_ERR_INVALID_ARGUMENT: return "invalid argument";
    case WIDE_ERR_UNSUPPORTED_DTYPE: return "unsupported dtype";
    case WIDE_ERR_WORKSPACE_TOO_SMALL: return "workspace too small";
    case WIDE_ERR_CUDA: return "CUDA error";
    case WIDE_ERR_NO_KERNEL: return "no compiled kernel for this GPU architecture";
    }
    return "unknown status";
}

int wide_kernels_api_version(void)
{
    return WIDE_KERNELS_API_VERSION;
}

char const* wide_last_cuda_error_string(void)
{
    return tLastCudaError.c_str();
}

int wide_kernels_cubin_count(void)
{
    return kNumCubins;
}

int wide_kernels_has_cubin(char const* key, int arch)
{
    return key && cubinArch(key, arch) >= 0 ? 1 : 0;
}

int wide_kernels_has_cublaslt(void)
{
    return haveLt() ? 1 : 0;
}

size_t wide_gemm_params_sizeof(void)
{
    return sizeof(wide_gemm_params_t);
}

int wide_router(void const* x, wide_dtype_t dtype, int64_t M, int64_t H, float const* wc, float const* bc, int64_t R,
    float const* wr, float const* br, int64_t G, int32_t* mask, cudaStream_t stream)
{
    if (!x || !wc || !bc || !wr || !br || !mask || M < 0 || H <= 0 || R <= 0 || G <= 0)
        return WIDE_ERR_INVALID_ARGUMENT;
    if (!dtypeName(dtype))
        return WIDE_ERR_UNSUPPORTED_DTYPE;
    int const blockR = routerBlockR(R);
    if (!blockR || M * H >= (int64_t{1} << 31))
        return WIDE_ERR_INVALID_ARGUMENT;
    if (M == 0)
        return WIDE_OK;
    int arch = 0;
    if (int s = deviceArch(arch))
        return s;
    Args a;
    a.ptr(x).ptr(wc).ptr(bc).ptr(wr).ptr(br).ptr(mask).i32(M).i32(H).i32(R).i32(G).i32(H);
    Step step = kernel(std::string("router/") + dtypeName(dtype) + "/r" + std::to_string(blockR), cdiv(M, kRouterBlockM),
        1, 1, std::move(a));
    return launch(step, arch, stream);
}

size_t wide_router_workspace_size(int64_t M, int64_t H, int64_t R)
{
    if (M <= 0 || H <= 0 || R <= 0)
        return 0;
    int64_t const sms = smCount();
    int64_t most = 0; // partials [S, M', R] of every M' <= M the split router runs for
    for (int64_t m = 1; m <= M && m <= kRouterSplitMaxM; ++m)
    {
        int64_t const r = routerPlan(m, H, R, sms).first * m;
        most = r > most ? r : most;
    }
    return align256(static_cast<size_t>(most) * R * 4);
}

int wide_router_ws(void const* x, wide_dtype_t dtype, int64_t M, int64_t H, float const* wc, float const* bc,
    int64_t R, float const* wr, float const* br, int64_t G, int32_t* mask, void* workspace, size_t workspace_size,
    cudaStream_t stream)
{
    if (!workspace || M > kRouterSplitMaxM || M <= 0 || R <= 0 || H <= 0 || !x || !wc || !bc || !wr || !br || !mask
        || G <= 0 || !dtypeName(dtype))
        return wide_router(x, dtype, M, H, wc, bc, R, wr, br, G, mask, stream); // validation + one-pass router
    int const blockR = routerBlockR(R);
    if (!blockR || M * H >= (int64_t{1} << 31))
        return WIDE_ERR_INVALID_ARGUMENT;
    int arch = 0;
    if (int s = deviceArch(arch))
        return s;
    auto const plan = routerPlan(M, H, R, smCount());
    if (workspace_size < static_cast<size_t>(plan.first) * M * R * 4)
        return wide_router(x, dtype, M, H, wc, bc, R, wr, br, G, mask, stream);
    Args a;
    a.ptr(x).ptr(wc).ptr(workspace).i32(M).i32(H).i32(R).i32(H).i32(plan.second);
    Step split = kernel(std::string("router_split/") + dtypeName(dtype), cdiv(M, kRouterSplitBlockM),
        cdiv(R, kRouterSplitBlockR), static_cast<unsigned>(plan.first), std::move(a));
    if (int s = launch(split, arch, stream))
        return s;
    Args b;
    b.ptr(workspace).ptr(bc).ptr(wr).ptr(br).ptr(mask).i32(M).i32(R).i32(G).i32(plan.first);
    Step logits = kernel("router_logits/r" + std::to_string(blockR), cdiv(M, kRouterBlockM), 1, 1, std::move(b));
    return launch(logits, arch, stream);
}

size_t wide_gemm_workspace_size(wide_gemm_params_t const* p)
{
    if (!p || p->group_size <= 0 || p->M < 0 || p->N < 0 || p->K < 0)
        return 0;
    // Sized for the grouped algorithm whatever AUTO picks at run time (monotonic in M): row lists for
    // the groups along N or K, plus the float32 accumulator of the K-pruned scatter-add.
    int64_t const G = (p->N > p->K ? p->N : p->K) / p->group_size;
    size_t grouped = rowsBytes(p->M, G) + align256(static_cast<size_t>(p->M) * p->N * 4);
    int64_t const split = splitRows(p->M, p->N, p->K); // the split-K GEMV's float32 partials [S, M, N]
    size_t const splitBytes = align256(static_cast<size_t>(split) * p->N * 4);
    grouped = grouped > splitBytes ? grouped : splitBytes;
    if (!kLtWorkspace)
        return grouped;
    // the dense path: the masked x (gemm_k) or the up projection (gated), then cuBLASLt's scratch
    size_t const dense = align256(static_cast<size_t>(p->M) * (p->N > p->K ? p->N : p->K) * 4) + kLtWorkspace;
    return grouped > dense ? grouped : dense;
}

int wide_gemm_resolve_algo(wide_gemm_params_t const* p, int kind_k, int arch)
{
    return p ? resolve(p, kind_k == 1, kind_k == 2, policyFor(arch, "")) : -1; // kind_k: 0 gemm_n, 1 gemm_k, 2 gated
}

int wide_gemm_describe(wide_gemm_params_t const* p, int op, int arch, void* workspace, size_t workspace_size,
    char* out, size_t out_size)
{
    return wide_gemm_describe_device(p, op, arch, nullptr, workspace, workspace_size, out, out_size);
}

int wide_gemm_describe_device(wide_gemm_params_t const* p, int op, int arch, char const* device, void* workspace,
    size_t workspace_size, char* out, size_t out_size)
{
    Plan steps;
    if (int s = plan(op, p, workspace, workspace_size, arch, device ? device : "", steps))
        return s;
    return describeInto(steps, arch, out, out_size);
}

int wide_gemm_n(wide_gemm_params_t const* p, void* workspace, size_t workspace_size, cudaStream_t stream)
{
    return gemm(WIDE_OP_GEMM_N, p, workspace, workspace_size, stream);
}

int wide_gemm_n_gated(wide_gemm_params_t const* p, void* workspace, size_t workspace_size, cudaStream_t stream)
{
    return gemm(WIDE_OP_GEMM_N_GATED, p, workspace, workspace_size, stream);
}

int wide_gemm_k(wide_gemm_params_t const* p, void* workspace, size_t workspace_size, cudaStream_t stream)
{
    return gemm(WIDE_OP_GEMM_K, p, workspace, workspace_size, stream);
}

size_t wide_attention_params_sizeof(void)
{
    return sizeof(wide_attention_params_t);
}

size_t wide_masked_attention_workspace_size(wide_attention_params_t const* p)
{
    int blockD = 0;
    if (attentionCheck(p, blockD, false) || p->T != 1 || !attnDecodes(p))
        return 0;
    size_t most = 0; // the partials of every batch up to B over S keys (more keys never split fewer ways)
    for (int64_t b = 1; b <= p->B; ++b)
        most = std::max(most, attnPartialBytes(attnSplits(b, p->Hk, p->S).first, b, p->Hq, p->D));
    return most;
}

int wide_masked_attention_describe(wide_attention_params_t const* p, int arch, void* workspace, size_t workspace_size,
    char* out, size_t out_size)
{
    Plan steps;
    if (int s = attentionPlan(p, workspace, workspace_size, steps))
        return s;
    return describeInto(steps, arch, out, out_size);
}

int wide_masked_attention(wide_attention_params_t const* p, void* workspace, size_t workspace_size, cudaStream_t stream)
{
    Plan steps;
    if (int s = attentionPlan(p, workspace, workspace_size, steps)) // before any CUDA call
        return s;
    int arch = 0;
    if (int s = deviceArch(arch))
        return s;
    return run(steps, arch, stream);
}

} // extern "C"
