#include "abi/rdmacm/wire.h"

#include <cstring>

namespace softrdma::rdmacm::wire {
namespace {

void put8(std::string* s, uint8_t v) { s->push_back(static_cast<char>(v)); }
void put16(std::string* s, uint16_t v) {
  put8(s, v >> 8);
  put8(s, v & 0xff);
}
void put32(std::string* s, uint32_t v) {
  put16(s, v >> 16);
  put16(s, v & 0xffff);
}
void put_bytes(std::string* s, const uint8_t* p, size_t n) { s->append(reinterpret_cast<const char*>(p), n); }

struct Reader {
  const uint8_t* p;
  size_t left;
  bool ok = true;
  uint8_t u8() {
    if (left < 1) return ok = false, 0;
    --left;
    return *p++;
  }
  uint16_t u16() { return static_cast<uint16_t>(u8() << 8 | u8()); }
  uint32_t u32() { return static_cast<uint32_t>(u16()) << 16 | u16(); }
  void bytes(uint8_t* out, size_t n) {
    if (left < n) {
      ok = false;
      return;
    }
    memcpy(out, p, n);
    p += n;
    left -= n;
  }
};

std::string header(Type type, size_t body) {
  std::string s;
  put32(&s, kMagic);
  put8(&s, kVersion);
  put8(&s, static_cast<uint8_t>(type));
  put16(&s, static_cast<uint16_t>(body));
  return s;
}

// The one description of a Conn's fields on the wire, for both directions.
template <typename F8, typename F32, typename FBytes>
void conn_fields(Conn& c, F8 f8, F32 f32, FBytes fbytes) {
  f32(c.qpn);
  f32(c.psn);
  fbytes(c.gid, sizeof c.gid);
  f8(c.mtu);
  f8(c.responder_resources);
  f8(c.initiator_depth);
  f8(c.flow_control);
  f8(c.retry_count);
  f8(c.rnr_retry_count);
  f8(c.srq);
  f8(c.status);
  f32(c.qkey);
  f8(c.private_data_len);
}

}  // namespace

std::string encode(Type type, const Conn& in) {
  std::string body;
  Conn c = in;
  conn_fields(
      c, [&](uint8_t& v) { put8(&body, v); }, [&](uint32_t& v) { put32(&body, v); },
      [&](uint8_t* p, size_t n) { put_bytes(&body, p, n); });
  put_bytes(&body, c.private_data, c.private_data_len);
  return header(type, body.size()) + body;
}

std::string encode(const Rej& r) {
  std::string body;
  put8(&body, r.reason);
  put8(&body, r.private_data_len);
  put_bytes(&body, r.private_data, r.private_data_len);
  return header(Type::kRej, body.size()) + body;
}

std::string encode(Type type) { return header(type, 0); }

std::optional<Message> decode(std::string* buf, bool* bad) {
  *bad = false;
  if (buf->size() < kHeaderSize) return std::nullopt;
  Reader h{reinterpret_cast<const uint8_t*>(buf->data()), kHeaderSize};
  const uint32_t magic = h.u32();
  const uint8_t version = h.u8();
  const uint8_t type = h.u8();
  const uint16_t len = h.u16();
  if (magic != kMagic || version != kVersion || type < 1 || type > static_cast<uint8_t>(Type::kSidrRep)) {
    *bad = true;
    return std::nullopt;
  }
  if (buf->size() < kHeaderSize + len) return std::nullopt;
  Message m{};
  m.type = static_cast<Type>(type);
  Reader r{reinterpret_cast<const uint8_t*>(buf->data()) + kHeaderSize, len};
  switch (m.type) {
    case Type::kReq:
    case Type::kRep:
    case Type::kSidrReq:
    case Type::kSidrRep:
      conn_fields(
          m.conn, [&](uint8_t& v) { v = r.u8(); }, [&](uint32_t& v) { v = r.u32(); },
          [&](uint8_t* p, size_t n) { r.bytes(p, n); });
      if (r.ok) r.bytes(m.conn.private_data, m.conn.private_data_len);
      break;
    case Type::kRej:
      m.rej.reason = r.u8();
      m.rej.private_data_len = r.u8();
      if (r.ok) r.bytes(m.rej.private_data, m.rej.private_data_len);
      break;
    default:
      break;
  }
  if (!r.ok || r.left != 0) {
    *bad = true;
    return std::nullopt;
  }
  buf->erase(0, kHeaderSize + len);
  return m;
}

}  // namespace softrdma::rdmacm::wire
