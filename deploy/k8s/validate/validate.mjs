#!/usr/bin/env node
// Validate Kubernetes manifests against the Kubernetes OpenAPI schemas.
//
//   kubectl kustomize deploy/k8s/base | node validate.mjs        # stdin
//   node validate.mjs rendered.yaml [more.yaml ...]               # files
//
// Every YAML document must be an object of a built-in apiVersion/kind known
// to the `kubernetes-models` package; it is checked with that kind's
// generated schema validator. Prints one line per valid object; exits 1 if
// any document fails (bad YAML, unknown apiVersion/kind, schema error,
// unknown field) or the objects of one input do not fit together (see
// crossChecks), and 2 on a usage error.
//
// Unknown fields: the kubernetes-models schemas do not set
// additionalProperties: false, so on their own they accept misspelled keys
// (e.g. `replica: 2`), which the API server would drop or, with strict field
// validation, reject. We catch those too: the generated validator reads
// every property its schema declares, so we hand it a proxy that records
// which keys it read, and any key of the object that it never read is not in
// the schema. This runs only after the schema check has passed, because a
// failing validator may stop reading early. Limitation: a field whose schema
// is free-form JSON would also be reported; no built-in kind used here has one.

import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

// Proxy wrapper that records, per object, the keys the validator reads.
const keysRead = new WeakMap(); // object -> Set of property names
function watched(node) {
  if (node === null || typeof node !== "object") return node;
  return new Proxy(node, {
    get(target, key) {
      if (typeof key === "string") {
        if (!keysRead.has(target)) keysRead.set(target, new Set());
        keysRead.get(target).add(key);
      }
      return watched(Reflect.get(target, key));
    },
  });
}

// JSON-pointer paths of keys in `node` that the validator never looked at.
function unknownFields(node, path = "", out = []) {
  if (Array.isArray(node)) {
    node.forEach((item, i) => unknownFields(item, `${path}/${i}`, out));
  } else if (node !== null && typeof node === "object") {
    const read = keysRead.get(node) ?? new Set();
    for (const [key, value] of Object.entries(node)) {
      if (read.has(key)) unknownFields(value, `${path}/${key}`, out);
      else out.push(`${path}/${key}`);
    }
  }
  return out;
}

// The kubernetes-models class for apiVersion/kind, or null if there is none.
// The package exports one module per apiVersion: "kubernetes-models/apps/v1".
async function modelClass(apiVersion, kind) {
  if (!/^([a-z0-9-]+(\.[a-z0-9-]+)*\/)?v\d+((alpha|beta)\d+)?$/.test(apiVersion)) return null;
  let group;
  try {
    group = await import(`kubernetes-models/${apiVersion}`);
  } catch (err) {
    if (err.code === "ERR_PACKAGE_PATH_NOT_EXPORTED") return null;
    throw err;
  }
  const cls = Object.hasOwn(group, kind) ? group[kind] : undefined;
  // Only top-level kinds carry apiVersion/kind (not e.g. "DeploymentSpec").
  return cls?.apiVersion === apiVersion && cls?.kind === kind ? cls : null;
}

async function validateDocument(obj) {
  if (obj === null || typeof obj !== "object" || Array.isArray(obj)) {
    return ["not a Kubernetes object (expected a mapping)"];
  }
  const { apiVersion, kind } = obj;
  if (typeof apiVersion !== "string" || typeof kind !== "string") {
    return ["missing apiVersion or kind"];
  }
  if (!obj.metadata?.name && !obj.metadata?.generateName) {
    return ["metadata.name is missing"];
  }
  const cls = await modelClass(apiVersion, kind);
  if (!cls) return [`no schema for apiVersion "${apiVersion}", kind "${kind}"`];
  try {
    // The model's validate() checks `this`; run it on the recording proxy.
    cls.prototype.validate.call(watched(obj));
  } catch (err) {
    return [`schema: ${err.message}`];
  }
  return unknownFields(obj).map((p) => `unknown field ${p}`);
}

// Cross-object checks within one input, for mistakes no schema can see:
// selectors that match no pods, ports that do not exist, dangling targets,
// mounts of undeclared volumes, claims that are not in the input.
// Selectors are compared by matchLabels only (matchExpressions are ignored).
function crossChecks(objs) {
  const problems = [];
  const deployments = objs.filter((o) => o.kind === "Deployment");
  const claims = new Set(
    objs.filter((o) => o.kind === "PersistentVolumeClaim").map((o) => o.metadata?.name),
  );
  const matches = (selector, labels) =>
    Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
  const selected = (selector) =>
    deployments.filter((d) => matches(selector, d.spec?.template?.metadata?.labels));
  // A port reference (name or number) that some container port answers to.
  const hasPort = (ports, ref) => ports.some((p) => p.name === ref || p.containerPort === ref);
  const podPorts = (d) =>
    (d.spec.template.spec?.containers ?? []).flatMap((c) => c.ports ?? []);

  for (const d of deployments) {
    const name = `Deployment ${d.metadata?.name}`;
    const pod = d.spec?.template;
    if (!matches(d.spec?.selector?.matchLabels, pod?.metadata?.labels)) {
      problems.push(`${name}: selector does not match its pod template labels`);
    }
    // Volume mounts must name a volume of the pod, and a claim must be an
    // object of the input (as HPA targets must): a pod on a missing claim
    // stays Pending.
    const volumes = pod?.spec?.volumes ?? [];
    const volumeNames = new Set(volumes.map((v) => v.name));
    for (const c of [...(pod?.spec?.initContainers ?? []), ...(pod?.spec?.containers ?? [])]) {
      for (const m of c.volumeMounts ?? []) {
        if (!volumeNames.has(m.name)) {
          problems.push(`${name}: ${c.name} mounts volume ${m.name}, which the pod does not have`);
        }
      }
    }
    for (const v of volumes) {
      const claim = v.persistentVolumeClaim?.claimName;
      if (claim && !claims.has(claim)) {
        problems.push(`${name}: volume ${v.name} uses PersistentVolumeClaim ${claim}, not in input`);
      }
    }
    for (const c of pod?.spec?.containers ?? []) {
      const ports = c.ports ?? [];
      for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
        const action = c[probe]?.grpc ?? c[probe]?.httpGet ?? c[probe]?.tcpSocket;
        if (action && !hasPort(ports, action.port)) {
          problems.push(`${name}: ${c.name}.${probe} port ${action.port} is not a container port`);
        }
      }
    }
  }
  for (const svc of objs.filter((o) => o.kind === "Service" && o.spec?.selector)) {
    const pods = selected(svc.spec.selector);
    const name = `Service ${svc.metadata?.name}`;
    if (!pods.length) problems.push(`${name}: selector matches no Deployment`);
    const ports = pods.flatMap(podPorts);
    for (const p of svc.spec.ports ?? []) {
      const target = p.targetPort ?? p.port;
      if (pods.length && !hasPort(ports, target)) {
        problems.push(`${name}: targetPort ${target} is not a container port`);
      }
    }
  }
  for (const pdb of objs.filter((o) => o.kind === "PodDisruptionBudget")) {
    if (!selected(pdb.spec?.selector?.matchLabels).length) {
      problems.push(`PodDisruptionBudget ${pdb.metadata?.name}: selector matches no Deployment`);
    }
  }
  for (const hpa of objs.filter((o) => o.kind === "HorizontalPodAutoscaler")) {
    const ref = hpa.spec?.scaleTargetRef;
    if (!ref) continue;
    const isTarget = (o) =>
      o.kind === ref.kind && o.apiVersion === ref.apiVersion && o.metadata?.name === ref.name;
    if (!objs.some(isTarget)) {
      const name = `HorizontalPodAutoscaler ${hpa.metadata?.name}`;
      problems.push(`${name}: target ${ref.kind} ${ref.name} not in input`);
    }
  }
  return problems;
}

function describe(obj) {
  const name = obj?.metadata?.name ?? "<no name>";
  return `${obj?.apiVersion ?? "?"} ${obj?.kind ?? "?"} ${name}`;
}

async function main(argv) {
  if (argv.some((a) => a === "-h" || a === "--help")) {
    console.log("usage: validate.mjs [FILE|-]...   (no FILE: read stdin)");
    return 0;
  }
  const inputs = argv.length ? argv : ["-"];
  let valid = 0;
  let failed = 0;
  let crossFailed = 0;
  for (const input of inputs) {
    const label = input === "-" ? "<stdin>" : input;
    let text;
    try {
      text = readFileSync(input === "-" ? 0 : input, "utf8");
    } catch (err) {
      console.error(`validate: cannot read ${label}: ${err.message}`);
      return 2;
    }
    // Duplicate keys are YAML errors here, as they are for the API server.
    const docs = parseAllDocuments(text, { prettyErrors: true });
    const validObjs = [];
    const failedBefore = failed;
    for (const [index, doc] of docs.entries()) {
      const where = `${label}#${index + 1}`;
      if (doc.errors.length) {
        failed++;
        for (const e of doc.errors) console.log(`FAIL ${where}: YAML: ${e.message}`);
        continue;
      }
      const obj = doc.toJS();
      if (obj === null || obj === undefined) continue; // empty document
      const problems = await validateDocument(obj);
      if (problems.length) {
        failed++;
        for (const p of problems) console.log(`FAIL ${where} ${describe(obj)}: ${p}`);
      } else {
        valid++;
        validObjs.push(obj);
        console.log(`ok   ${describe(obj)}`);
      }
    }
    // Only when every object passed: a missing one would just cause noise.
    const crossProblems = failed > failedBefore ? [] : crossChecks(validObjs);
    for (const p of crossProblems) console.log(`FAIL ${label}: ${p}`);
    crossFailed += crossProblems.length;
  }
  if (valid + failed === 0) {
    console.log("FAIL no Kubernetes objects in the input");
    return 1;
  }
  console.log(`${valid} valid, ${failed} invalid, ${crossFailed} cross-object problems`);
  return failed || crossFailed ? 1 : 0;
}

process.exitCode = await main(process.argv.slice(2));
