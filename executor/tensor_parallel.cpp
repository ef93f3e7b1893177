#include "executor/tensor_parallel.hpp"

#include <map>
#include <optional>

namespace tiermem::exec {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

struct Block {
  int column = -1;  // the column-parallel matmul
  int bias = -1;    // its bias_add (-1: none)
  int middle = -1;  // the activation or the attention
  int row = -1;     // the row-parallel matmul
};

class Sharder {
 public:
  Sharder(Graph& g, int ways, int index) : m_g(g), m_ways(ways), m_index(index) {
    for (size_t i = 0; i < g.ops.size(); ++i) {
      for (int t : g.ops[i].in) m_consumers[t].push_back(static_cast<int>(i));
    }
  }

  Result<std::vector<std::string>> run() {
    std::vector<Block> blocks;
    for (size_t i = 0; i < m_g.ops.size(); ++i) {
      if (auto b = block_at(static_cast<int>(i))) blocks.push_back(*b);
    }
    if (blocks.empty()) {
      return Status(ErrorCode::invalid_argument,
                    "--tensor-parallel " + std::to_string(m_ways) + ": model '" + m_g.name +
                        "' has no block to split (a MATMUL by a PARAM whose output reaches a second one through a "
                        "bias, an activation or a CAUSAL_ATTENTION, used nowhere else)");
    }
    std::vector<std::string> report;
    for (const Block& b : blocks) {
      auto line = shard(b);
      if (!line.ok()) return line.status();
      report.push_back(*line);
    }
    rebuild(blocks);
    return report;
  }

 private:
  // The single op reading `t` (-1: none or several).
  int only_consumer(int t) const {
    auto it = m_consumers.find(t);
    return it != m_consumers.end() && it->second.size() == 1 ? it->second[0] : -1;
  }
  bool is_param_matrix(int t) const {
    return m_g.tensors[t].role == Role::param && m_g.tensors[t].shape.size() == 2;
  }

  std::optional<Block> block_at(int i) const {
    const Op& op = m_g.ops[i];
    // Every parameter cut is read by its op alone (a weight shared with
    // another op, tied, stays whole: the block is not split).
    if (op.kind != proto::MATMUL || !is_param_matrix(op.in[1]) || only_consumer(op.in[1]) != i) return std::nullopt;
    Block b;
    b.column = i;
    int out = op.out[0];
    int next = only_consumer(out);
    if (next >= 0 && m_g.ops[next].kind == proto::BIAS_ADD && m_g.ops[next].in[0] == out &&
        m_g.tensors[m_g.ops[next].in[1]].role == Role::param && only_consumer(m_g.ops[next].in[1]) == next) {
      b.bias = next;
      out = m_g.ops[next].out[0];
      next = only_consumer(out);
    }
    if (next < 0) return std::nullopt;
    const Op& middle = m_g.ops[next];
    const bool activation = middle.kind == proto::RELU || middle.kind == proto::GELU;
    if (!(activation || middle.kind == proto::CAUSAL_ATTENTION) || middle.in[0] != out) return std::nullopt;
    b.middle = next;
    const int row = only_consumer(middle.out[0]);
    if (row < 0 || m_g.ops[row].kind != proto::MATMUL || m_g.ops[row].in[0] != middle.out[0] ||
        !is_param_matrix(m_g.ops[row].in[1]) || only_consumer(m_g.ops[row].in[1]) != row) {
      return std::nullopt;
    }
    b.row = row;
    return b;
  }

  void resize_columns(int t, int64_t cols) { m_g.tensors[t].shape.back() = cols; }

  // A parameter cut to `shape`, starting as rows from `row` and `columns`
  // of what it was.
  void cut(int t, std::vector<int64_t> shape, int64_t row, const Ranges& columns) {
    Tensor& p = m_g.tensors[t];
    const Tensor whole = p;
    p.shape = std::move(shape);
    init_as_part_of(whole, row, columns, &p);
  }

  Result<std::string> shard(const Block& b) {
    const Op& col = m_g.ops[b.column];
    Op& middle = m_g.ops[b.middle];
    const Op& row = m_g.ops[b.row];
    const int64_t k = m_g.tensors[col.in[1]].shape[0], n = m_g.tensors[col.in[1]].shape[1];
    const int64_t k2 = m_g.tensors[row.in[1]].shape[1];
    const int64_t t = m_index;
    Ranges columns;
    int64_t width = 0, rows_from = 0, rows = 0;  // the part's columns; W2's rows
    std::string what;
    if (middle.kind == proto::CAUSAL_ATTENTION) {
      if (middle.heads % m_ways != 0) {
        return Status(ErrorCode::invalid_argument, "--tensor-parallel " + std::to_string(m_ways) + ": op '" +
                                                       middle.name + "' has " + std::to_string(middle.heads) +
                                                       " heads, which " + std::to_string(m_ways) + " ranks cannot share");
      }
      const int64_t d_model = n / 3, d = d_model / m_ways;
      columns = {{t * d, d}, {d_model + t * d, d}, {2 * d_model + t * d, d}};
      width = 3 * d;
      rows_from = t * d;
      rows = d;
      what = "by heads: " + std::to_string(middle.heads / m_ways) + " of " + std::to_string(middle.heads) + " per rank";
      middle.heads /= m_ways;
      resize_columns(middle.out[0], d);
      m_g.tensors[middle.out[1]].shape[0] /= m_ways;  // the softmax of this rank's heads
    } else {
      if (n % m_ways != 0) {
        return Status(ErrorCode::invalid_argument, "--tensor-parallel " + std::to_string(m_ways) + ": op '" + col.name +
                                                       "' has " + std::to_string(n) + " columns, which " +
                                                       std::to_string(m_ways) + " ranks cannot share");
      }
      width = n / m_ways;
      columns = {{t * width, width}};
      rows_from = t * width;
      rows = width;
      what = "by columns: " + std::to_string(width) + " of " + std::to_string(n) + " per rank";
      resize_columns(middle.out[0], width);
    }
    cut(col.in[1], {k, width}, 0, columns);
    resize_columns(col.out[0], width);
    if (b.bias >= 0) {
      const Op& bias = m_g.ops[b.bias];
      cut(bias.in[1], {width}, 0, columns);
      resize_columns(bias.out[0], width);
    }
    cut(row.in[1], {rows, k2}, rows_from, {{0, k2}});
    return "'" + col.name + "' -> '" + row.name + "' split " + what;
  }

  int add_tensor(const Tensor& like, const std::string& name) {
    Tensor t = like;
    t.name = name;
    t.role = Role::activation;
    t.producer = -1;
    t.grad = -1;
    m_g.tensors.push_back(std::move(t));
    return static_cast<int>(m_g.tensors.size()) - 1;
  }

  // The ops again, with a tp_identity before each block and a
  // tp_all_reduce after its row matmul.
  void rebuild(const std::vector<Block>& blocks) {
    std::map<int, int> before, after;  // op -> block
    for (size_t i = 0; i < blocks.size(); ++i) {
      before[blocks[i].column] = static_cast<int>(i);
      after[blocks[i].row] = static_cast<int>(i);
    }
    std::vector<Op> ops;
    for (size_t i = 0; i < m_g.ops.size(); ++i) {
      Op op = m_g.ops[i];
      if (before.count(static_cast<int>(i)) != 0) {
        Op in;
        in.name = op.name + ".tp_in";
        in.kind = proto::TP_IDENTITY;
        in.in = {op.in[0]};
        in.out = {add_tensor(m_g.tensors[op.in[0]], op.name + ".tp_in")};
        in.accumulate = {false};
        op.in[0] = in.out[0];
        ops.push_back(std::move(in));
      }
      if (after.count(static_cast<int>(i)) != 0) {
        Op sum;
        sum.name = op.name + ".tp_sum";
        sum.kind = proto::TP_ALL_REDUCE;
        sum.out = {op.out[0]};
        sum.accumulate = {false};
        op.out[0] = add_tensor(m_g.tensors[op.out[0]], op.name + ".partial");
        sum.in = {op.out[0]};
        ops.push_back(std::move(op));
        ops.push_back(std::move(sum));
        continue;
      }
      ops.push_back(std::move(op));
    }
    m_g.ops = std::move(ops);
    for (Tensor& t : m_g.tensors) t.producer = -1;
    for (size_t i = 0; i < m_g.ops.size(); ++i) {
      for (int t : m_g.ops[i].out) {
        if (m_g.tensors[t].producer < 0) m_g.tensors[t].producer = static_cast<int>(i);
      }
    }
  }

  Graph& m_g;
  int m_ways, m_index;
  std::map<int, std::vector<int>> m_consumers;
};

}  // namespace

Result<std::vector<std::string>> shard_for_tensor_parallel(Graph& forward, int ways, int index) {
  if (ways <= 1) return std::vector<std::string>{};
  if (!forward.ops_of(Phase::backward).empty()) {
    return Status(ErrorCode::failed_precondition, "tensor parallelism splits the forward graph, before autodiff");
  }
  return Sharder(forward, ways, index).run();
}

}  // namespace tiermem::exec
