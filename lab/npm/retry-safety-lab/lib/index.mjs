// `import` of the CommonJS helper: one implementation for both module systems.
import lab from "./index.js";

export const { startLab, startUpstream, findBinary, failureMessage, LabError, LabFailed } = lab;
export default lab;
