// retarget_device_literals: a traced module's `device=cuda:0` literals follow
// the module to another GPU (--devices); CPU literals stay. Compiled from
// TorchScript source here, so no GPU is needed.
#include <gtest/gtest.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/script.h>

#include "model/sdxl_model.h"

namespace {

std::vector<std::string> device_literals(torch::jit::Module& m) {
  std::vector<std::string> out;
  for (const auto& sub : m.modules())
    for (const auto& method : sub.get_methods())
      for (torch::jit::Node* n : method.graph()->nodes())
        if (n->kind() == c10::prim::Constant && n->output()->type()->kind() == c10::TypeKind::DeviceObjType)
          out.push_back(n->s(c10::attr::value));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(DeviceLiterals, CudaLiteralsFollowTheModuleCpuLiteralsStay) {
  torch::jit::Module inner("Inner");
  inner.define(R"(
def forward(self, x):
    return x + torch.zeros([2], device=torch.device("cuda:0"))
)");
  torch::jit::Module outer("Outer");
  outer.register_module("inner", inner);
  outer.define(R"(
def forward(self, x):
    y = torch.ones([2], device=torch.device("cpu"))
    return self.inner.forward(x.to(torch.device("cuda:0"))) + y
)");
  EXPECT_EQ(device_literals(outer), (std::vector<std::string>{"cpu", "cuda:0", "cuda:0"}));
  EXPECT_EQ(sdxl::retarget_device_literals(outer, torch::Device("cuda:1")), 2);
  EXPECT_EQ(device_literals(outer), (std::vector<std::string>{"cpu", "cuda:1", "cuda:1"}));
  EXPECT_EQ(sdxl::retarget_device_literals(outer, torch::Device("cuda:1")), 0) << "nothing left to move";
  EXPECT_EQ(sdxl::retarget_device_literals(outer, torch::Device("cpu")), 0) << "a CPU run keeps the literals";
}
