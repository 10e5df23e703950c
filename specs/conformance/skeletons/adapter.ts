// A skeleton adapter for a TypeScript port of turnstile's agent-loop core.
//
// It speaks the adapter protocol of PROTOCOL.md §3 (one JSON object per line on stdin and
// stdout) around a `Core`, the part you write. `StarterCore` below is the first rung of the
// ladder in the kit's README ("First vectors"): it passes `M26-cancel` (publication, and a
// cancel with nothing pending) and refuses to guess anything else. Replace it with your core,
// rung by rung:
//
//   node adapter.ts                                   (Node 23.6+; 22.6+: --experimental-strip-types)
//   turnstile check --port "node adapter.ts" --tag first:1
//   turnstile check --port "node adapter.ts" --tag first        (the whole ladder, in order)
//
// Only erasable TypeScript is used (no enums, namespaces or parameter properties), so Node
// runs this file as it is; `tsc --strict --erasableSyntaxOnly` accepts it too.

import { createInterface } from "node:readline";

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type JsonObject = { [key: string]: Json };

/** The refusal kinds of PROTOCOL.md §1: what a command that raises reports. */
export type RefusalKind = "validation" | "protocol" | "disposed" | "invariant";

/** Throw this from `Core.apply` when your core refuses a command (it changes nothing). */
export class Refused extends Error {
  kind: RefusalKind;

  constructor(kind: RefusalKind, message: string) {
    super(message);
    this.kind = kind;
  }
}

/** What the adapter needs from your core: spec protocol.md P1 (outputs) and P9 (inputs). */
export interface Core {
  /** Apply one input (its P9 JSON). Throw `Refused` for a refused command. */
  apply(input: JsonObject): void;
  /** The next output (its P1 JSON; durable events without `time`), or undefined when the core
   * waits for an input. */
  nextOutput(): JsonObject | undefined;
}

/** The optional features your port supports (PROTOCOL.md §3): add "seed", "append",
 * "observer", "prepare-result", "request-header" as your core gains them. */
const CAPABILITIES: string[] = [];
/** Vector tags your port deviates from on purpose (for a port of the original:
 * "differs-from-original"). */
const DEVIATIONS: string[] = [];
const IMPLEMENTATION = "typescript-skeleton 0.1";

/** The first rung: a core that only publishes itself (P11: session/created, agent/created,
 * agent/session-start) and knows that a cancel with nothing pending does nothing (R16.1). */
class StarterCore implements Core {
  private readonly outputs: JsonObject[] = [];

  constructor(config: JsonObject) {
    const start = config["sessionStart"] === "resume" ? "resume" : "startup";
    this.outputs.push(
      { out: "live", type: "session/created" },
      { out: "live", type: "agent/created", status: "idle" },
      { out: "live", type: "agent/session-start", source: start },
    );
  }

  apply(input: JsonObject): void {
    if (input["in"] === "cancel") {
      const cause = input["cause"];
      if (typeof cause !== "object" || cause === null || Array.isArray(cause)
          || typeof cause["kind"] !== "string") {
        throw new Refused("validation", "cancel: cause must be {kind, ...}");
      }
      return; // nothing is queued, staged or running: the cancel is not effective
    }
    throw new Error(`not implemented yet: the ${JSON.stringify(input["in"])} input`);
  }

  nextOutput(): JsonObject | undefined {
    return this.outputs.shift();
  }
}

/** Build a fresh core for one vector: its config (P11) and seeded log (events without time). */
function createCore(config: JsonObject, seed: Json[]): Core {
  if (seed.length > 0) {
    throw new Error("not implemented yet: a seeded log (declare the seed capability first)");
  }
  return new StarterCore(config);
}

// ---------------------------------------------------------------------------------------
// The adapter loop: read a request, act on the core, write the replies (PROTOCOL.md §3).
// ---------------------------------------------------------------------------------------

let core: Core | undefined;

function handle(request: JsonObject): JsonObject[] {
  switch (request["op"]) {
    case "hello":
      return [{ op: "hello", protocol: 1, implementation: IMPLEMENTATION,
                capabilities: CAPABILITIES, deviations: DEVIATIONS }];
    case "start": {
      const config = request["config"];
      const seed = request["seed"] ?? [];
      if (typeof config !== "object" || config === null || Array.isArray(config)
          || !Array.isArray(seed)) {
        return [{ op: "error", message: "start: config must be an object, seed an array" }];
      }
      core = createCore(config, seed);
      return [{ op: "started" }];
    }
    case "input": {
      const input = request["input"];
      if (core === undefined || typeof input !== "object" || input === null
          || Array.isArray(input)) {
        return [{ op: "error", message: "input: no core started, or the input is not an object" }];
      }
      try {
        core.apply(input);
      } catch (error: unknown) {
        if (error instanceof Refused) {
          return [{ op: "refused", kind: error.kind, message: error.message }];
        }
        throw error;
      }
      return [{ op: "accepted" }];
    }
    case "pull": {
      const max = request["max"];
      if (core === undefined || typeof max !== "number") {
        return [{ op: "error", message: "pull: no core started, or max is not a number" }];
      }
      const replies: JsonObject[] = [];
      for (let pulled = 0; pulled < max; pulled += 1) {
        const output = core.nextOutput();
        if (output === undefined) {
          replies.push({ op: "waiting" }); // "no more outputs now"
          break;
        }
        replies.push({ op: "output", output });
      }
      return replies;
    }
    default:
      return [{ op: "error", message: `unknown op ${JSON.stringify(request["op"])}` }];
  }
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
lines.on("line", (line: string) => {
  const request = JSON.parse(line) as JsonObject;
  if (request["op"] === "bye") {
    lines.close();
    return;
  }
  let replies: JsonObject[];
  try {
    replies = handle(request);
  } catch (error: unknown) {
    // An input your core does not handle yet: the checker reports it as a port error for this
    // vector (naming this message) and starts the port afresh for the next one.
    replies = [{ op: "error", message: error instanceof Error ? error.message : String(error) }];
  }
  process.stdout.write(replies.map((reply) => JSON.stringify(reply) + "\n").join(""));
});
lines.on("close", () => process.exit(0));
