// masked_gemm_k_plugin.cpp: fields of WideMaskedGemmK; the rest is WideGemmPlugin.
#include "masked_gemm_k_plugin.h"

#include <climits>

namespace wide
{
namespace trt
{
namespace
{

// Exports since the o_proj bias wire a bias input [N] (zeros and has_bias = 0 when the checkpoint has none);
// older ones have 3 inputs and no has_bias field, which defaults to 0.
GemmSpec specFor(std::vector<IntField> const& fields)
{
    int32_t const hasBias = fieldValue(fields, "has_bias");
    check(hasBias == 0 || hasBias == 1, MaskedGemmKPlugin::kName,
        "has_bias must be 0 or 1, got " + std::to_string(hasBias));
    return GemmSpec{1, true, true, hasBias == 1, &wide_gemm_k};
}

} // namespace

std::vector<std::string> MaskedGemmKPlugin::fieldNames()
{
    return {"group_size", "has_bias"};
}

std::vector<int32_t> MaskedGemmKPlugin::fieldDefaults()
{
    return {INT32_MIN, 0};
}

MaskedGemmKPlugin::MaskedGemmKPlugin(std::vector<IntField> fields)
    : WidePluginT(kName, fields, specFor(fields))
{
}

} // namespace trt
} // namespace wide
