// Validates Prometheus Operator manifests against the operator's CRD schemas
// (@kubernetes-models/prometheus-operator, installed by scripts/setup.sh under
// /usr/local/lib/ferroce-node): node crd_check.mjs FILE.yaml...
// Prints "passed KIND/NAME" per resource; exits 1 naming what fails.
import { readFileSync } from "node:fs";

const root = process.env.FERROCE_NODE_MODULES || "/usr/local/lib/ferroce-node/node_modules";
const yaml = (await import(`${root}/js-yaml/dist/js-yaml.mjs`)).default;
const models = {
  ServiceMonitor: "monitoring.coreos.com/v1/ServiceMonitor.js",
  PodMonitor: "monitoring.coreos.com/v1/PodMonitor.js",
  PrometheusRule: "monitoring.coreos.com/v1/PrometheusRule.js",
};
let bad = 0;
for (const file of process.argv.slice(2)) {
  for (const doc of yaml.loadAll(readFileSync(file, "utf8"))) {
    if (!doc) continue;
    const path = models[doc.kind];
    if (!doc.apiVersion?.startsWith("monitoring.coreos.com/") || !path) {
      console.log(`${file}: ${doc.kind} is not a Prometheus Operator kind this checks`);
      bad++;
      continue;
    }
    const mod = await import(`${root}/@kubernetes-models/prometheus-operator/${path}`);
    try {
      new mod[doc.kind](doc).validate();
      console.log(`${file}: passed ${doc.kind}/${doc.metadata?.name}`);
    } catch (e) {
      console.log(`${file}: ${doc.kind}/${doc.metadata?.name}: ${e.message}`);
      bad++;
    }
  }
}
process.exit(bad ? 1 : 0);
