#include "core/forward/packed_matrix.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/forward/onednn_support.h"

namespace attnserve::core {

absl::StatusOr<PackedMatrix> PackMatrix(std::span<const float> plain, int64_t rows, int64_t cols,
                                        int64_t ld, dnnl::memory::data_type type) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  if (ld < cols || static_cast<int64_t>(plain.size()) < (rows - 1) * ld + cols) {
    return absl::InvalidArgumentError(absl::StrCat("PackMatrix: ", plain.size(),
                                                   " values cannot hold ", rows, " x ", cols,
                                                   " with leading dimension ", ld));
  }
  try {
    const dnnl::engine& engine = CpuEngine();
    // Any representative row count works: the preferred weights layout depends on K and N only.
    constexpr int64_t kProbeRows = 256;
    const dnnl::memory::desc src({kProbeRows, rows}, type, tag::ab);
    const dnnl::memory::desc any_weights({rows, cols}, type, tag::any);
    const dnnl::memory::desc dst({kProbeRows, cols}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, any_weights, dst), engine);

    PackedMatrix packed;
    packed.rows = rows;
    packed.cols = cols;
    packed.desc = pd.weights_desc();
    auto storage = std::make_shared<AlignedBuffer>(packed.bytes() / sizeof(float) + 1);
    packed.begin = storage->data();
    packed.storage = std::move(storage);

    const dnnl::memory::desc plain_desc({rows, cols}, dt::f32, dnnl::memory::dims{ld, 1});
    dnnl::memory from(plain_desc, engine, const_cast<float*>(plain.data()));
    dnnl::memory to(packed.desc, engine, const_cast<float*>(packed.begin));
    dnnl::stream stream(engine);
    dnnl::reorder(from, to).execute(stream, from, to);
    stream.wait();
    return packed;
  } catch (const dnnl::error& e) {
    return OneDnnError(e, "packing weights");
  }
}

PackedMatrix ShareIfIdentical(PackedMatrix part, const PackedMatrix& whole, size_t offset) {
  const size_t offset_bytes = offset * sizeof(float);
  if (offset_bytes > whole.bytes() || part.bytes() > whole.bytes() - offset_bytes) return part;
  if (std::memcmp(whole.data() + offset, part.data(), part.bytes()) != 0) return part;
  part.storage = whole.storage;
  part.begin = whole.data() + offset;
  return part;
}

}  // namespace attnserve::core
