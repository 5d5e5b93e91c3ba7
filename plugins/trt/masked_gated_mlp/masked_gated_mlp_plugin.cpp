// masked_gated_mlp_plugin.cpp: fields of WideMaskedGatedMlp; the rest is WideGemmPlugin.
#include "masked_gated_mlp_plugin.h"

#include <climits>

namespace wide
{
namespace trt
{

std::vector<std::string> MaskedGatedMlpPlugin::fieldNames()
{
    return {"group_size"};
}

std::vector<int32_t> MaskedGatedMlpPlugin::fieldDefaults()
{
    return {INT32_MIN};
}

MaskedGatedMlpPlugin::MaskedGatedMlpPlugin(std::vector<IntField> fields)
    : WidePluginT(kName, std::move(fields), GemmSpec{2, false, false, false, &wide_gemm_n_gated})
{
}

} // namespace trt
} // namespace wide
