// AllKinds (types.fbs) from a seed, and a field-by-field check against it:
// both ends of a call build and check with these.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "types_generated.h"

namespace cgtest_util {

namespace v1 = cgtest::types::v1;

inline std::string text_of(uint64_t seed) {
  // UTF-8 and an embedded NUL: strings are sized, not terminated.
  return std::string("h\xc3\xa9llo \xe2\x9c\x93 \0 #", 12) + std::to_string(seed);
}

inline flatbuffers::Offset<v1::AllKinds> build_all_kinds(flatbuffers::FlatBufferBuilder& fbb,
                                                         uint64_t seed) {
  const auto s = static_cast<int64_t>(seed);
  const auto text = fbb.CreateString(text_of(seed));
  const std::vector<int32_t> ints = {static_cast<int32_t>(s), -static_cast<int32_t>(s),
                                     std::numeric_limits<int32_t>::max(),
                                     std::numeric_limits<int32_t>::min()};
  const auto f_ints = fbb.CreateVector(ints);
  const std::vector<double> doubles = {0.5 * static_cast<double>(s), -1e-300, 1e300};
  const auto f_doubles = fbb.CreateVector(doubles);
  std::vector<uint8_t> bytes(256);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i + seed);
  const auto f_bytes = fbb.CreateVector(bytes);
  const std::vector<std::string> strings = {"", "one", "seed " + std::to_string(seed)};
  const auto f_strings = fbb.CreateVectorOfStrings(strings);
  std::vector<flatbuffers::Offset<v1::Inner>> inners;
  for (int i = 0; i < 3; ++i)
    inners.push_back(v1::CreateInner(fbb, fbb.CreateString("inner" + std::to_string(i)),
                                     static_cast<int32_t>(s) * 10 + i));
  const auto f_tables = fbb.CreateVector(inners);
  const std::vector<v1::Vec3> structs = {v1::Vec3(1, 2, 3), v1::Vec3(-1.5f, 0, static_cast<float>(s))};
  const auto f_structs = fbb.CreateVectorOfStructs(structs);
  const std::vector<int8_t> colors = {v1::Color_Red, v1::Color_Green, v1::Color_Blue};
  const auto f_colors = fbb.CreateVector(colors);
  flatbuffers::Offset<void> shape;
  v1::Shape shape_type;
  if (seed % 2 == 0) {
    shape_type = v1::Shape_Circle;
    shape = v1::CreateCircle(fbb, 0.25f + static_cast<float>(s)).Union();
  } else {
    shape_type = v1::Shape_Square;
    shape = v1::CreateSquare(fbb, 1.0 / 3 + static_cast<double>(s)).Union();
  }
  const auto f_inner = v1::CreateInner(fbb, fbb.CreateString("nested"), -7);
  const v1::Vec3 vec(0.5f, -0.25f, static_cast<float>(s));
  const v1::Pair pair(static_cast<int32_t>(s) + 1, v1::Vec3(4, 5, 6));

  v1::AllKindsBuilder b(fbb);
  b.add_f_bool(seed % 2 == 1);
  b.add_f_byte(static_cast<int8_t>(-128 + static_cast<int>(seed % 7)));
  b.add_f_ubyte(static_cast<uint8_t>(255 - seed % 7));
  b.add_f_short(static_cast<int16_t>(std::numeric_limits<int16_t>::min() + static_cast<int>(seed % 100)));
  b.add_f_ushort(static_cast<uint16_t>(65535 - seed % 100));
  b.add_f_int(std::numeric_limits<int32_t>::min() + static_cast<int32_t>(seed % 1000));
  b.add_f_uint(std::numeric_limits<uint32_t>::max() - static_cast<uint32_t>(seed % 1000));
  b.add_f_long(std::numeric_limits<int64_t>::min() + s);
  b.add_f_ulong(std::numeric_limits<uint64_t>::max() - seed);
  b.add_f_float(1.5f * static_cast<float>(s) + 0.25f);
  b.add_f_double(1e300 / static_cast<double>(seed + 1));
  b.add_f_string(text);
  b.add_f_ints(f_ints);
  b.add_f_doubles(f_doubles);
  b.add_f_bytes(f_bytes);
  b.add_f_strings(f_strings);
  b.add_f_tables(f_tables);
  b.add_f_vec(&vec);
  b.add_f_pair(&pair);
  b.add_f_structs(f_structs);
  b.add_f_color(v1::Color_Blue);
  b.add_f_colors(f_colors);
  b.add_f_shape_type(shape_type);
  b.add_f_shape(shape);
  b.add_f_inner(f_inner);
  return b.Finish();
}

// Empty when `m` is build_all_kinds(seed), else the first field that differs.
inline std::string check_all_kinds(const v1::AllKinds* m, uint64_t seed) {
  if (m == nullptr) return "no message";
  const auto s = static_cast<int64_t>(seed);
#define CG_EXPECT(cond) \
  if (!(cond)) return #cond
  CG_EXPECT(m->f_bool() == (seed % 2 == 1));
  CG_EXPECT(m->f_byte() == -128 + static_cast<int>(seed % 7));
  CG_EXPECT(m->f_ubyte() == 255 - seed % 7);
  CG_EXPECT(m->f_short() == std::numeric_limits<int16_t>::min() + static_cast<int>(seed % 100));
  CG_EXPECT(m->f_ushort() == 65535 - seed % 100);
  CG_EXPECT(m->f_int() == std::numeric_limits<int32_t>::min() + static_cast<int32_t>(seed % 1000));
  CG_EXPECT(m->f_uint() == std::numeric_limits<uint32_t>::max() - static_cast<uint32_t>(seed % 1000));
  CG_EXPECT(m->f_long() == std::numeric_limits<int64_t>::min() + s);
  CG_EXPECT(m->f_ulong() == std::numeric_limits<uint64_t>::max() - seed);
  CG_EXPECT(m->f_float() == 1.5f * static_cast<float>(s) + 0.25f);
  CG_EXPECT(m->f_double() == 1e300 / static_cast<double>(seed + 1));
  CG_EXPECT(m->f_string() != nullptr && m->f_string()->str() == text_of(seed));
  CG_EXPECT(m->f_ints() != nullptr && m->f_ints()->size() == 4);
  CG_EXPECT(m->f_ints()->Get(0) == static_cast<int32_t>(s) && m->f_ints()->Get(1) == -static_cast<int32_t>(s));
  CG_EXPECT(m->f_ints()->Get(2) == std::numeric_limits<int32_t>::max());
  CG_EXPECT(m->f_ints()->Get(3) == std::numeric_limits<int32_t>::min());
  CG_EXPECT(m->f_doubles() != nullptr && m->f_doubles()->size() == 3);
  CG_EXPECT(m->f_doubles()->Get(0) == 0.5 * static_cast<double>(s));
  CG_EXPECT(m->f_doubles()->Get(1) == -1e-300 && m->f_doubles()->Get(2) == 1e300);
  CG_EXPECT(m->f_bytes() != nullptr && m->f_bytes()->size() == 256);
  for (uint32_t i = 0; i < 256; ++i) CG_EXPECT(m->f_bytes()->Get(i) == static_cast<uint8_t>(i + seed));
  CG_EXPECT(m->f_strings() != nullptr && m->f_strings()->size() == 3);
  CG_EXPECT(m->f_strings()->Get(0)->str().empty() && m->f_strings()->Get(1)->str() == "one");
  CG_EXPECT(m->f_strings()->Get(2)->str() == "seed " + std::to_string(seed));
  CG_EXPECT(m->f_tables() != nullptr && m->f_tables()->size() == 3);
  for (uint32_t i = 0; i < 3; ++i) {
    const v1::Inner* in = m->f_tables()->Get(i);
    CG_EXPECT(in->name() != nullptr && in->name()->str() == "inner" + std::to_string(i));
    CG_EXPECT(in->value() == static_cast<int32_t>(s) * 10 + static_cast<int32_t>(i));
  }
  CG_EXPECT(m->f_vec() != nullptr && m->f_vec()->x() == 0.5f && m->f_vec()->y() == -0.25f);
  CG_EXPECT(m->f_vec()->z() == static_cast<float>(s));
  CG_EXPECT(m->f_pair() != nullptr && m->f_pair()->id() == static_cast<int32_t>(s) + 1);
  CG_EXPECT(m->f_pair()->at().x() == 4 && m->f_pair()->at().y() == 5 && m->f_pair()->at().z() == 6);
  CG_EXPECT(m->f_structs() != nullptr && m->f_structs()->size() == 2);
  CG_EXPECT(m->f_structs()->Get(0)->x() == 1 && m->f_structs()->Get(0)->z() == 3);
  CG_EXPECT(m->f_structs()->Get(1)->x() == -1.5f && m->f_structs()->Get(1)->z() == static_cast<float>(s));
  CG_EXPECT(m->f_color() == v1::Color_Blue);
  CG_EXPECT(m->f_colors() != nullptr && m->f_colors()->size() == 3);
  CG_EXPECT(m->f_colors()->Get(0) == v1::Color_Red && m->f_colors()->Get(2) == v1::Color_Blue);
  if (seed % 2 == 0) {
    CG_EXPECT(m->f_shape_type() == v1::Shape_Circle && m->f_shape_as_Circle() != nullptr);
    CG_EXPECT(m->f_shape_as_Circle()->radius() == 0.25f + static_cast<float>(s));
  } else {
    CG_EXPECT(m->f_shape_type() == v1::Shape_Square && m->f_shape_as_Square() != nullptr);
    CG_EXPECT(m->f_shape_as_Square()->side() == 1.0 / 3 + static_cast<double>(s));
  }
  CG_EXPECT(m->f_inner() != nullptr && m->f_inner()->name()->str() == "nested");
  CG_EXPECT(m->f_inner()->value() == -7);
  CG_EXPECT(m->f_defaulted() == 42);
#undef CG_EXPECT
  return "";
}

}  // namespace cgtest_util
