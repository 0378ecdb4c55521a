// Everything a slotrpc user includes.
#pragma once

#include "slotrpc/call.h"
#include "slotrpc/channel.h"
#include "slotrpc/config.h"
#include "slotrpc/fiber.h"
#include "slotrpc/future.h"
#include "slotrpc/histogram.h"
#include "slotrpc/memory.h"
#include "slotrpc/metrics.h"
#include "slotrpc/raw.h"
#include "slotrpc/reply.h"
#include "slotrpc/result.h"
#include "slotrpc/runtime.h"
#include "slotrpc/server.h"
#include "slotrpc/service.h"
#include "slotrpc/status.h"
#include "slotrpc/stream.h"
