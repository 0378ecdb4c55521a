// What the fan-out services say, shared by the slotrpc and the gRPC side so
// both carry byte-for-byte the same messages: a timeline of 10 post ids,
// three posts of 280 characters, four media items, and the frontend's
// combination of the three.  Includes whichever fanout_generated.h the
// including target generated (flatc, same schema, same output).
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fanout_generated.h"

namespace bench::fanout {

namespace fo = slotrpc::fanout;

inline constexpr uint32_t kTimelinePosts = 10;
inline constexpr uint32_t kPosts = 3;
inline constexpr uint32_t kMediaItems = 4;
inline constexpr size_t kPostChars = 280;

// The request of load step request i: users cycle through 1..1000.
inline uint64_t user_of(uint64_t i) { return 1 + i % 1000; }

inline std::string post_text(uint64_t id) {
  std::string s = "Post " + std::to_string(id) + ": ";
  while (s.size() < kPostChars) s += "the quick brown fox jumps over the lazy dog; ";
  s.resize(kPostChars);
  return s;
}

inline flatbuffers::Offset<fo::UserRequest> build_user(flatbuffers::FlatBufferBuilder& fbb, uint64_t uid) {
  return fo::CreateUserRequest(fbb, uid);
}

inline flatbuffers::Offset<fo::TimelineReply> build_timeline(flatbuffers::FlatBufferBuilder& fbb, uint64_t uid) {
  uint64_t ids[kTimelinePosts];
  for (uint32_t i = 0; i < kTimelinePosts; ++i) ids[i] = uid * 100 + i;
  return fo::CreateTimelineReply(fbb, uid, fbb.CreateVector(ids, kTimelinePosts));
}

inline flatbuffers::Offset<fo::PostsReply> build_posts(flatbuffers::FlatBufferBuilder& fbb, uint64_t uid) {
  flatbuffers::Offset<fo::Post> posts[kPosts];
  for (uint32_t i = 0; i < kPosts; ++i) {
    const uint64_t id = uid * 100 + i;
    posts[i] = fo::CreatePost(fbb, id, uid, fbb.CreateString(post_text(id)));
  }
  return fo::CreatePostsReply(fbb, fbb.CreateVector(posts, kPosts));
}

inline flatbuffers::Offset<fo::MediaReply> build_media(flatbuffers::FlatBufferBuilder& fbb, uint64_t uid) {
  flatbuffers::Offset<fo::MediaItem> items[kMediaItems];
  for (uint32_t i = 0; i < kMediaItems; ++i) {
    const uint64_t id = uid * 10 + i;
    items[i] = fo::CreateMediaItem(fbb, id, fbb.CreateString("https://media.example/" + std::to_string(id) + ".jpg"),
                                   1080, 720);
  }
  return fo::CreateMediaReply(fbb, fbb.CreateVector(items, kMediaItems));
}

// The frontend's reply: the three backend replies copied into one message
// (a real frontend would filter and rank; copying is the part every one does).
inline flatbuffers::Offset<fo::HomeReply> build_home(flatbuffers::FlatBufferBuilder& fbb, uint64_t uid,
                                                    const fo::TimelineReply& t, const fo::PostsReply& p,
                                                    const fo::MediaReply& m) {
  std::vector<uint64_t> ids;
  if (t.post_ids() != nullptr) ids.assign(t.post_ids()->begin(), t.post_ids()->end());
  std::vector<flatbuffers::Offset<fo::Post>> posts;
  if (p.posts() != nullptr) {
    for (const fo::Post* x : *p.posts()) {
      posts.push_back(fo::CreatePost(fbb, x->id(), x->author(), fbb.CreateString(x->text())));
    }
  }
  std::vector<flatbuffers::Offset<fo::MediaItem>> items;
  if (m.items() != nullptr) {
    for (const fo::MediaItem* x : *m.items()) {
      items.push_back(fo::CreateMediaItem(fbb, x->id(), fbb.CreateString(x->url()), x->width(), x->height()));
    }
  }
  return fo::CreateHomeReply(fbb, uid, fbb.CreateVector(ids), fbb.CreateVector(posts), fbb.CreateVector(items));
}

// Empty when `r` is the complete home page of `uid`; otherwise what is wrong.
inline std::string check_home(const fo::HomeReply* r, uint64_t uid) {
  if (r == nullptr) return "no reply message";
  if (r->user_id() != uid) return "reply for user " + std::to_string(r->user_id()) + ", not " + std::to_string(uid);
  if (r->post_ids() == nullptr || r->post_ids()->size() != kTimelinePosts) return "wrong timeline";
  if (r->posts() == nullptr || r->posts()->size() != kPosts) return "wrong posts";
  for (const fo::Post* p : *r->posts()) {
    if (p->text() == nullptr || p->text()->size() != kPostChars || p->author() != uid) return "wrong post";
  }
  if (r->media() == nullptr || r->media()->size() != kMediaItems) return "wrong media";
  return {};
}

}  // namespace bench::fanout
