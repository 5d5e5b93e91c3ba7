// masked_gemm_n_plugin.cpp: fields of WideMaskedGemmN; the rest is WideGemmPlugin.
#include "masked_gemm_n_plugin.h"

#include <climits>

namespace wide
{
namespace trt
{
namespace
{

GemmSpec specFor(std::vector<IntField> const& fields)
{
    int32_t const hasBias = fieldValue(fields, "has_bias");
    check(hasBias == 0 || hasBias == 1, MaskedGemmNPlugin::kName,
        "has_bias must be 0 or 1, got " + std::to_string(hasBias));
    return GemmSpec{1, false, true, hasBias == 1, &wide_gemm_n};
}

} // namespace

std::vector<std::string> MaskedGemmNPlugin::fieldNames()
{
    return {"group_size", "has_bias"};
}

std::vector<int32_t> MaskedGemmNPlugin::fieldDefaults()
{
    return {INT32_MIN, 0};
}

MaskedGemmNPlugin::MaskedGemmNPlugin(std::vector<IntField> fields)
    : WidePluginT(kName, fields, specFor(fields))
{
}

} // namespace trt
} // namespace wide
