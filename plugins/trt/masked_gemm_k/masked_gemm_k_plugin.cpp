// masked_gemm_k_plugin.cpp: fields of WideMaskedGemmK; the rest is WideGemmPlugin.
#include "masked_gemm_k_plugin.h"

#include <climits>

namespace wide
{
namespace trt
{

std::vector<std::string> MaskedGemmKPlugin::fieldNames()
{
    return {"group_size"};
}

std::vector<int32_t> MaskedGemmKPlugin::fieldDefaults()
{
    return {INT32_MIN};
}

MaskedGemmKPlugin::MaskedGemmKPlugin(std::vector<IntField> fields)
    : WidePluginT(kName, std::move(fields), GemmSpec{1, true, false, false, &wide_gemm_k})
{
}

} // namespace trt
} // namespace wide
