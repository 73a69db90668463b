// The model identity, whole-model plans, manifests that catch a flipped byte, and the errors a user sees
// for a range, a file or an output that cannot be sliced.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gguf/gguf_file.h"
#include "slice/gguf_slice.h"
#include "slice_test_util.h"

namespace essaim {
namespace {

using testing::make_test_dir;
using testing::TestMoeSpec;
using testing::write_test_moe;

struct Opened {
  GgufFile src;
  MoeLayout moe;
};

Opened open_model(const std::string& path) {
  Result<GgufFile> src = GgufFile::open(path);
  EXPECT_TRUE(src) << src.status().message();
  Result<MoeLayout> moe = moe_layout(*src);
  EXPECT_TRUE(moe) << moe.status().message();
  return {std::move(*src), std::move(*moe)};
}

std::string error_of(const Status& s) {
  EXPECT_FALSE(s.is_ok());
  return s.message();
}

#define EXPECT_MESSAGE_HAS(status, text) \
  EXPECT_NE(error_of(status).find(text), std::string::npos) << "message: " << (status).message()

TEST(ModelIdentity, HashesHeaderAndTensorTableOnly) {
  const std::string dir = make_test_dir("identity");
  ASSERT_TRUE(write_test_moe(dir + "/a.gguf", {.n_embd = 64, .n_ff = 32, .seed = 1}).is_ok());
  ASSERT_TRUE(write_test_moe(dir + "/b.gguf", {.n_embd = 64, .n_ff = 32, .seed = 2}).is_ok());  // other weights, same layout
  ASSERT_TRUE(write_test_moe(dir + "/c.gguf", {.n_expert = 9, .n_embd = 64, .n_ff = 32, .seed = 1}).is_ok());  // other layout
  Result<GgufFile> a = GgufFile::open(dir + "/a.gguf");
  Result<GgufFile> b = GgufFile::open(dir + "/b.gguf");
  Result<GgufFile> c = GgufFile::open(dir + "/c.gguf");
  ASSERT_TRUE(a && b && c);
  const ModelIdentity id = model_identity(*a);
  EXPECT_EQ(id, *sha256_file(dir + "/a.gguf", 0, a->data_start()));
  EXPECT_EQ(id, model_identity(*b));  // documented: the identity names a layout, the manifest's hashes the bytes
  EXPECT_NE(id, model_identity(*c));
  EXPECT_NE(*sha256_file(dir + "/a.gguf"), *sha256_file(dir + "/b.gguf"));
  EXPECT_EQ(*source_model_identity(*a), id);
  EXPECT_EQ(digest_from_hex(digest_hex(id)), id);
  EXPECT_EQ(digest_hex(id).size(), 64u);
  EXPECT_FALSE(digest_from_hex(digest_hex(id).substr(1)));
  EXPECT_FALSE(digest_from_hex(std::string(63, '0') + "g"));
  // The well-known digest of "abc" pins the SHA-256 wrapper itself.
  const std::string abc = "abc";
  EXPECT_EQ(digest_hex(sha256({reinterpret_cast<const uint8_t*>(abc.data()), abc.size()})),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_FALSE(sha256_file(dir + "/a.gguf", a->file_size() - 10, 11));  // past the end
}

TEST(SlicePlan, LastSliceIsShorterWhenNDoesNotDivide) {
  const std::string dir = make_test_dir("plan");
  ASSERT_TRUE(write_test_moe(dir + "/m.gguf", {.n_layer = 4, .n_dense_layers = 1, .n_expert = 12, .n_embd = 64, .n_ff = 32}).is_ok());
  Opened m = open_model(dir + "/m.gguf");
  Result<SliceManifest> plan = plan_manifest(m.src, m.moe, {.experts_per_slice = 5, .stem = "t"});
  ASSERT_TRUE(plan) << plan.status().message();
  ASSERT_EQ(plan->slices.size(), 9u);  // 3 MoE layers x (5, 5, 2)
  const ManifestSlice& last = plan->slices.back();
  EXPECT_EQ(last.file, "t.L3.E10-11.gguf");
  EXPECT_EQ(last.layer_first, 3u);
  EXPECT_EQ(last.expert_first, 10u);
  EXPECT_EQ(last.expert_count, 2u);
  EXPECT_EQ(plan->slices.front().file, "t.L1.E00-04.gguf");  // layer 0 is dense: not planned
  EXPECT_LT(last.bytes, plan->slices.front().bytes);
  EXPECT_FALSE(plan->backbone);

  // Planning writes nothing.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1);

  const std::string out = dir + "/out";
  Result<SliceManifest> done = write_plan(m.src, m.moe, *plan, out);
  ASSERT_TRUE(done) << done.status().message();
  for (size_t i = 0; i < done->slices.size(); ++i) {
    const ManifestSlice& e = done->slices[i];
    EXPECT_EQ(std::filesystem::file_size(out + "/" + e.file), plan->slices[i].bytes) << e.file;
    EXPECT_EQ(e.sha256, *sha256_file(out + "/" + e.file)) << e.file;
  }
  // Each slice is unique (different experts), so no two hashes agree.
  EXPECT_NE(done->slices[0].sha256, done->slices[1].sha256);
  EXPECT_TRUE(std::filesystem::exists(out + "/manifest.json"));
  EXPECT_FALSE(std::filesystem::exists(out + "/t.L1.E00-04.gguf.part"));

  // A slice per layer as large as the whole layer.
  Result<SliceManifest> whole = plan_manifest(m.src, m.moe, {.experts_per_slice = 1000});
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->slices.size(), 3u);
  EXPECT_EQ(whole->slices[0].file, "qwen3moe.L1.E00-11.gguf");
  EXPECT_MESSAGE_HAS(plan_manifest(m.src, m.moe, {.experts_per_slice = 0}).status(), "at least 1 expert");
}

TEST(SliceManifestJson, RoundTripsAndVerifies) {
  const std::string dir = make_test_dir("manifest");
  ASSERT_TRUE(write_test_moe(dir + "/m.gguf", {.n_layer = 2, .n_expert = 4}).is_ok());
  Opened m = open_model(dir + "/m.gguf");
  Result<SliceManifest> plan = plan_manifest(m.src, m.moe, {.experts_per_slice = 2, .with_backbone = true});
  ASSERT_TRUE(plan);
  Result<SliceManifest> done = write_plan(m.src, m.moe, *plan, dir + "/out");
  ASSERT_TRUE(done) << done.status().message();
  ASSERT_TRUE(done->backbone);
  EXPECT_EQ(done->backbone->file, "qwen3moe.backbone.gguf");
  EXPECT_EQ(done->source_file, "m.gguf");
  EXPECT_EQ(done->source_model, m.moe.source_model);

  Result<SliceManifest> back = SliceManifest::parse(done->to_json());
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->to_json(), done->to_json());
  EXPECT_EQ(back->backbone->sha256, done->backbone->sha256);
  ASSERT_EQ(back->slices.size(), 4u);
  EXPECT_EQ(back->slices[3].sha256, done->slices[3].sha256);
  EXPECT_TRUE(verify_manifest(*back, dir + "/out").is_ok());
}

TEST(SliceManifestVerify, DetectsAFlippedByteATruncationAndAMissingFile) {
  const std::string dir = make_test_dir("verify");
  ASSERT_TRUE(write_test_moe(dir + "/m.gguf", {.n_layer = 2, .n_expert = 4, .expert_type = GgmlType::Q4_K}).is_ok());
  Opened m = open_model(dir + "/m.gguf");
  Result<SliceManifest> plan = plan_manifest(m.src, m.moe, {.experts_per_slice = 2});
  ASSERT_TRUE(plan);
  const std::string out = dir + "/out";
  Result<SliceManifest> done = write_plan(m.src, m.moe, *plan, out);
  ASSERT_TRUE(done);
  ASSERT_TRUE(verify_manifest(*done, out).is_ok());

  // One bit in the middle of an expert slab: same size, different hash.
  const std::string victim = out + "/" + done->slices[1].file;
  const uint64_t at = std::filesystem::file_size(victim) / 2;
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(at));
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(std::streamoff(at));
    f.write(&c, 1);
  }
  Status s = verify_manifest(*done, out);
  EXPECT_MESSAGE_HAS(s, done->slices[1].file + ": SHA-256");
  EXPECT_MESSAGE_HAS(s, "1 of 4 files");

  std::filesystem::resize_file(out + "/" + done->slices[2].file, 100);
  std::filesystem::remove(out + "/" + done->slices[3].file);
  s = verify_manifest(*done, out);
  EXPECT_MESSAGE_HAS(s, "3 of 4 files");
  EXPECT_MESSAGE_HAS(s, done->slices[2].file + ": 100 bytes, the manifest says");
  EXPECT_MESSAGE_HAS(s, done->slices[3].file + ": No such file");
}

TEST(SliceErrors, BadRangesAreRefusedWithWhatTheModelHas) {
  const std::string dir = make_test_dir("ranges");
  ASSERT_TRUE(write_test_moe(dir + "/m.gguf", {.n_layer = 4, .n_dense_layers = 1, .n_expert = 8}).is_ok());
  Opened m = open_model(dir + "/m.gguf");
  const auto err = [&](SliceRange r) { return expert_slice_file(m.src, m.moe, r).status(); };
  EXPECT_MESSAGE_HAS(err({.layer_first = 3, .layer_count = 2}), "layers 3-4 lie beyond the model's 4 layers (0-3)");
  EXPECT_MESSAGE_HAS(err({.layer_first = 1, .expert_first = 6, .expert_count = 3}),
                     "experts 6-8 lie beyond the model's 8 experts (0-7)");
  EXPECT_MESSAGE_HAS(err({.layer_first = 0, .layer_count = 2}), "layer 0 has no routed experts (MoE layers: 1-3)");
  EXPECT_MESSAGE_HAS(err({.layer_first = 1, .expert_count = 0}), "expert range is empty");
  EXPECT_MESSAGE_HAS(err({.layer_first = 1, .layer_count = 0}), "layer range is empty");
  // Sums near 2^32 must not wrap into a range that looks valid.
  EXPECT_MESSAGE_HAS(err({.layer_first = 1, .expert_first = UINT32_MAX, .expert_count = 2}), "beyond");
  EXPECT_MESSAGE_HAS(err({.layer_first = UINT32_MAX, .layer_count = 2}), "beyond");
}

TEST(SliceErrors, FilesThatAreNotFullMoeModelsAreRefused) {
  const std::string dir = make_test_dir("not-moe");
  ASSERT_TRUE(write_test_moe(dir + "/dense.gguf", {.with_experts = false}).is_ok());
  Result<GgufFile> dense = GgufFile::open(dir + "/dense.gguf");
  ASSERT_TRUE(dense);
  Status s = moe_layout(*dense).status();
  EXPECT_MESSAGE_HAS(s, "not a Mixture-of-Experts model");
  EXPECT_MESSAGE_HAS(s, "dense.gguf");

  ASSERT_TRUE(write_test_moe(dir + "/gemma.gguf", {.arch = "gemma4"}).is_ok());
  Result<GgufFile> unknown = GgufFile::open(dir + "/gemma.gguf");
  ASSERT_TRUE(unknown);
  EXPECT_MESSAGE_HAS(moe_layout(*unknown).status(), "architecture 'gemma4'");

  // A block count no model has (the u32 after the key and its type id) is refused before any layer is named.
  ASSERT_TRUE(write_test_moe(dir + "/huge.gguf", {.n_layer = 2, .n_expert = 4}).is_ok());
  {
    std::fstream io(dir + "/huge.gguf", std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(io)), std::istreambuf_iterator<char>());
    const size_t key = bytes.find("qwen3moe.block_count");
    ASSERT_NE(key, std::string::npos);
    const uint32_t huge = 0x80000001u;
    io.seekp(std::streamoff(key + std::string_view("qwen3moe.block_count").size() + 4));
    io.write(reinterpret_cast<const char*>(&huge), sizeof huge);
  }
  Result<GgufFile> huge = GgufFile::open(dir + "/huge.gguf");
  ASSERT_TRUE(huge);
  EXPECT_MESSAGE_HAS(moe_layout(*huge).status(), "'qwen3moe.block_count' is 2147483649, expected 1..4096");

  ASSERT_TRUE(write_test_moe(dir + "/m.gguf", {.n_layer = 2, .n_expert = 4}).is_ok());
  Opened m = open_model(dir + "/m.gguf");
  Result<OutFile> f = expert_slice_file(m.src, m.moe, {.layer_first = 0, .expert_count = 2});
  ASSERT_TRUE(f);
  ASSERT_TRUE(write_out_file(*f, dir + "/s.gguf"));
  Result<GgufFile> slice = GgufFile::open(dir + "/s.gguf");
  ASSERT_TRUE(slice);
  EXPECT_MESSAGE_HAS(moe_layout(*slice).status(), "is an essaim expert slice, not a full model");
}

TEST(SliceErrors, UnwritableOutputIsAnErrorAndLeavesNothingBehind) {
  const std::string dir = make_test_dir("unwritable");
  ASSERT_TRUE(write_test_moe(dir + "/m.gguf", {.n_layer = 2, .n_expert = 4}).is_ok());
  Opened m = open_model(dir + "/m.gguf");
  Result<OutFile> f = expert_slice_file(m.src, m.moe, {.expert_count = 4});
  ASSERT_TRUE(f);
  EXPECT_MESSAGE_HAS(write_out_file(*f, dir + "/no/such/dir/s.gguf").status(), "cannot create");

  Result<SliceManifest> plan = plan_manifest(m.src, m.moe, {.experts_per_slice = 2});
  ASSERT_TRUE(plan);
  // A plain file where the output directory should be.
  std::ofstream(dir + "/blocker") << "x";
  EXPECT_MESSAGE_HAS(write_plan(m.src, m.moe, *plan, dir + "/blocker/out").status(), "cannot create directory");
  if (::geteuid() != 0) {  // root writes through permission bits
    std::filesystem::create_directories(dir + "/ro");
    ::chmod((dir + "/ro").c_str(), 0555);
    EXPECT_MESSAGE_HAS(write_plan(m.src, m.moe, *plan, dir + "/ro").status(), "Permission denied");
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir + "/ro"), {}), 0);
    ::chmod((dir + "/ro").c_str(), 0755);
  }
}

}  // namespace
}  // namespace essaim
