// The video section's reader (batch/video_spec.h) and the frame maths of `sdxl-batch video`
// (video/video_plan.h): timeline, ease, boxes, blends, .srt times, the box resize. The encoded
// video against a PIL reference is tests/e2e/test_video.py.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>

#include "batch/batch_file.h"
#include "batch/video_spec.h"
#include "image/resize.h"
#include "video/video_plan.h"

namespace {

std::vector<sdxl::BatchProblem> problems_of(const std::string& video) {
  std::vector<sdxl::BatchProblem> problems;
  sdxl::parse_batch_text(R"({"version": 1, "tasks": [{"id": "a", "prompt": "x", "count": 2}, {"id": "b", "prompt": "y"}],
                            "video": )" + video + "}",
                         "/tmp/none/batch.json", sdxl::GenerationParams{}, &problems);
  return problems;
}

sdxl::VideoSpec spec_of(const std::string& video) {
  std::vector<sdxl::BatchProblem> problems;
  const sdxl::BatchFile bf = sdxl::parse_batch_text(
      R"({"version": 1, "tasks": [{"id": "a", "prompt": "x", "count": 2}, {"id": "b", "prompt": "y"}], "video": )" +
          video + "}",
      "/tmp/none/batch.json", sdxl::GenerationParams{}, &problems);
  EXPECT_TRUE(problems.empty()) << (problems.empty() ? "" : problems[0].pointer + ": " + problems[0].message);
  return bf.video ? *bf.video : sdxl::VideoSpec{};
}

}  // namespace

TEST(VideoSpec, WithoutClipsEveryImageInFileOrder) {
  const sdxl::VideoSpec s = spec_of(R"({"size": "96x160", "fps": 10, "default": {"duration": 2, "motion": "pan-up"}})");
  ASSERT_EQ(s.clips.size(), 3u);
  EXPECT_EQ(s.clips[0].task + std::to_string(s.clips[0].index), "a0");
  EXPECT_EQ(s.clips[1].task + std::to_string(s.clips[1].index), "a1");
  EXPECT_EQ(s.clips[2].task, "b");
  EXPECT_EQ(s.clips[2].duration, 2.0);
  EXPECT_EQ(s.clips[2].motion.name, "pan-up");
  EXPECT_EQ(s.width, 96);
}

TEST(VideoSpec, BadInputAtItsPointer) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"clips": [{"task": "zz"}]})", "/video/clips/0/task"},
      {R"({"clips": [{"task": "a", "index": 2}]})", "/video/clips/0/index"},
      {R"({"clips": [{"task": "a", "duration": 0}]})", "/video/clips/0/duration"},
      {R"({"clips": [{"task": "a", "duration": -1}]})", "/video/clips/0/duration"},
      {R"({"clips": [{"task": "a", "duration": "3"}]})", "/video/clips/0/duration"},
      {R"({"fps": 10, "clips": [{"task": "a", "duration": 1, "transition": {"kind": "crossfade", "seconds": 1.1}},
           {"task": "b"}]})", "/video/clips/0/transition"},
      {R"({"clips": [{"task": "a", "motion": {"from": [0, 0, 1, 1.01], "to": [0, 0, 1, 1]}}]})",
       "/video/clips/0/motion/from"},
      {R"({"clips": [{"task": "a", "motion": {"from": [0, 0, 1, 1], "to": [0.5, 0, 0.5, 1]}}]})",
       "/video/clips/0/motion/to"},
      {R"({"clips": [{"task": "a", "motion": "spin"}]})", "/video/clips/0/motion"},
      {R"({"clips": [{"task": "a", "transition": {"kind": "wipe"}}]})", "/video/clips/0/transition/kind"},
      {R"({"clips": [{"task": "a", "image": "x.png"}]})", "/video/clips/0/image"},
      {R"({"clips": [{"caption": "no source"}]})", "/video/clips/0"},
      {R"({"size": "1080x1921"})", "/video/size"},
      {R"({"fps": 0})", "/video/fps"},
      {R"({"captions": {"font": "none.ttf"}})", "/video/captions/font"},
      {R"({"audio": {"volume": 1}})", "/video/audio/file"},
      {R"({"speed": 2})", "/video/speed"},
  };
  for (const auto& [video, pointer] : cases) {
    const auto problems = problems_of(video);
    ASSERT_FALSE(problems.empty()) << video;
    EXPECT_EQ(problems[0].pointer, pointer) << video << ": " << problems[0].message;
  }
}

TEST(VideoPlan, TimelineOverlapsTransitions) {
  const sdxl::VideoSpec s = spec_of(R"({"fps": 10, "default": {"duration": 1.5, "transition": {"kind": "crossfade",
      "seconds": 0.4}}, "clips": [{"task": "a"}, {"task": "a", "index": 1, "transition": {"kind": "cut"}},
      {"task": "b", "duration": 2, "transition": {"kind": "fade-black", "seconds": 0.5}}]})");
  const sdxl::VideoTimeline t = sdxl::plan_timeline(s);
  ASSERT_EQ(t.clips.size(), 3u);
  EXPECT_EQ(t.clips[0].frames, 15);
  EXPECT_EQ(t.clips[0].out_overlap, 4);
  EXPECT_EQ(t.clips[1].start, 11);
  EXPECT_EQ(t.clips[1].in_overlap, 4);
  EXPECT_EQ(t.clips[1].out_overlap, 0);  // a cut
  EXPECT_EQ(t.clips[2].start, 26);
  EXPECT_EQ(t.clips[2].out_overlap, 0);  // the last clip's transition leads nowhere
  EXPECT_EQ(t.total_frames, 15 + 15 + 20 - 4);
  EXPECT_EQ(sdxl::srt_time(26, 10), "00:00:02,600");
  EXPECT_EQ(sdxl::srt_time(36001, 10), "01:00:00,100");
}

TEST(VideoPlan, EaseBoxesAndCrop) {
  EXPECT_DOUBLE_EQ(sdxl::video_ease("in-out", 0.5), 0.5);
  EXPECT_NEAR(sdxl::video_ease("in-out", 0.25), 0.5 - 0.5 * std::cos(M_PI / 4), 1e-12);
  sdxl::VideoMotion m;
  ASSERT_TRUE(sdxl::named_video_motion("zoom-in", m));
  const sdxl::VideoBox mid = sdxl::motion_box(m, 2, 5);  // t = 0.5
  EXPECT_DOUBLE_EQ(mid.x0, 0.05);
  EXPECT_DOUBLE_EQ(mid.y1, 0.95);
  EXPECT_DOUBLE_EQ(sdxl::motion_box(m, 0, 1).x0, 0.0);  // one frame shows `from`
  // A square box on a portrait frame keeps its height and its centre.
  const sdxl::VideoBox b = sdxl::frame_source_box({0, 0, 1, 1}, 1000, 1000, 90, 160);
  EXPECT_DOUBLE_EQ(b.y0, 0);
  EXPECT_DOUBLE_EQ(b.y1, 1000);
  EXPECT_DOUBLE_EQ(b.x1 - b.x0, 1000 * 90.0 / 160);
  EXPECT_DOUBLE_EQ((b.x0 + b.x1) / 2, 500);
  // A wide frame from a tall box keeps the width.
  const sdxl::VideoBox w = sdxl::frame_source_box({0, 0, 1, 1}, 100, 400, 200, 100);
  EXPECT_DOUBLE_EQ(w.y1 - w.y0, 50);
  EXPECT_DOUBLE_EQ((w.y0 + w.y1) / 2, 200);
}

TEST(VideoPlan, Blends) {
  const std::vector<std::uint8_t> a(6, 200), b(6, 20);
  // k = 3: alpha = 1/4, 2/4, 3/4.
  EXPECT_EQ(sdxl::blend_transition("crossfade", a, b, 0, 3)[0], 155);
  EXPECT_EQ(sdxl::blend_transition("crossfade", a, b, 2, 3)[0], 65);
  EXPECT_EQ(sdxl::blend_transition("fade-black", a, b, 0, 3)[0], 100);  // a at 1 - 2/4
  EXPECT_EQ(sdxl::blend_transition("fade-black", a, b, 1, 3)[0], 0);    // black in the middle
  EXPECT_EQ(sdxl::blend_transition("fade-black", a, b, 2, 3)[0], 10);   // b at 2 * 3/4 - 1
}

TEST(VideoPlan, WholeImageBoxEqualsPlainResize) {
  // Both run PIL's passes horizontal first when the height does not shrink much more.
  std::vector<std::uint8_t> img(37 * 23 * 3);
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<std::uint8_t>((i * 7919) % 251);
  EXPECT_EQ(sdxl::resize_lanczos_box_rgb8(img.data(), 37, 23, 16, 20, {0, 0, 37, 23}),
            sdxl::resize_lanczos_rgb8(img.data(), 37, 23, 16, 20));
  EXPECT_EQ(sdxl::resize_lanczos_box_rgb8(img.data(), 37, 23, 50, 40, {0, 0, 37, 23}),
            sdxl::resize_lanczos_rgb8(img.data(), 37, 23, 50, 40));
}
